"""Planning a user's own model: profile each block once, then choose the cut, the schedule,
the microbatch count and recompute together (:func:`plan`), and run the plan
(:func:`stages_of`, ``Plan.schedule()``). The search itself is pure:
:mod:`nobubble.pipeline.plan`."""

from nobubble.pipeline.runtime.planning.model import plan, profile_blocks, stages_of

__all__ = ["plan", "profile_blocks", "stages_of"]
