"""Planning a user's own model: profile each block once, then choose the cut, the schedule,
the microbatch count and recompute together (:func:`plan`), and run the plan
(``split_model(blocks, p.num_stages, balance=p)``, ``p.schedule()``). The search itself is pure:
:mod:`nobubble.pipeline.plan`."""

from nobubble.pipeline.runtime.planning.model import plan, profile_blocks
from nobubble.pipeline.runtime.planning.probe import RuntimeCosts, measure_runtime

__all__ = ["plan", "profile_blocks", "measure_runtime", "RuntimeCosts"]
