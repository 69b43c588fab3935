"""Planning a user's own model: profile each block once, then choose the cut, the schedule,
the microbatch count and recompute together (:func:`plan`), and run the plan
(:func:`stages_of`, :func:`schedule_of`). The search itself is pure:
:mod:`nobubble.pipeline.plan`."""

from nobubble.pipeline.runtime.planning.model import (
    ModelPlan,
    plan,
    profile_blocks,
    schedule_of,
    stages_of,
)

__all__ = ["ModelPlan", "plan", "profile_blocks", "schedule_of", "stages_of"]
