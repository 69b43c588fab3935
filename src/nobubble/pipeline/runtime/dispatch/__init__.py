"""The ``handshake`` dispatch policy at run time (``PipelineRunner(dispatch="handshake")``).

- :mod:`.channel`: :class:`KeyedChannel`, messages that name their tensor (kind, stage,
  microbatch) in the header, so a receiver takes whatever its neighbours send, in any order
- :mod:`.cursor`: :class:`PlanCursor`, one rank's progress through its plan and the rule
  that picks its next op; :func:`run_dynamic`, one step's loop; :func:`plan_levels`
- :mod:`.slow`: :func:`straggle`, a real straggler rank (sleeps in proportion to each op)
"""

from __future__ import annotations

from nobubble.pipeline.runtime.dispatch.channel import KeyedChannel
from nobubble.pipeline.runtime.dispatch.cursor import PlanCursor, plan_levels, run_dynamic
from nobubble.pipeline.runtime.dispatch.slow import straggle

__all__ = ["KeyedChannel", "PlanCursor", "plan_levels", "run_dynamic", "straggle"]
