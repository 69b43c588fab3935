"""Planning a model: profile each block once, then choose the cut, the schedule, the
microbatch count and recompute together (:func:`plan`; :func:`plan_model` measures the
runtime's own costs first), and run the plan (``split_model(blocks, p.num_stages,
balance=p)``, ``p.schedule()``). A built-in model is planned on the cut ``pp run`` builds
(:func:`plan_builtin`, or :func:`plan_from_profile` from a stage profile; :func:`make_plan`
picks the planner of its source); a plan of the
user's own model trains on local ranks with :func:`train_plan`. The search itself is pure:
:mod:`nobubble.pipeline.plan`."""

from nobubble.pipeline.runtime.planning.builtin import (
    builtin_cuts,
    make_plan,
    plan_builtin,
    plan_from_profile,
)
from nobubble.pipeline.runtime.planning.model import plan, plan_model, profile_blocks
from nobubble.pipeline.runtime.planning.probe import RuntimeCosts, measure_runtime
from nobubble.pipeline.runtime.planning.train import PlanRun, UserModel, train_plan

__all__ = ["plan", "plan_model", "profile_blocks", "measure_runtime", "RuntimeCosts",
           "plan_builtin", "plan_from_profile", "builtin_cuts", "make_plan", "train_plan", "UserModel",
           "PlanRun"]  # fmt: skip
