"""Planning a user's own model: profile each block once, then choose the cut, the schedule,
the microbatch count and recompute together (:func:`plan`; :func:`plan_model` measures the
runtime's own costs first), and run the plan (``split_model(blocks, p.num_stages,
balance=p)``, ``p.schedule()``). The search itself is pure:
:mod:`nobubble.pipeline.plan`."""

from nobubble.pipeline.runtime.planning.model import plan, plan_model, profile_blocks
from nobubble.pipeline.runtime.planning.probe import RuntimeCosts, measure_runtime

__all__ = ["plan", "plan_model", "profile_blocks", "measure_runtime", "RuntimeCosts"]
