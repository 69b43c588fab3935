"""Re-planning while training: the layers re-cut over the ranks from live costs.

- :mod:`.partition`: the least-bottleneck contiguous cut for measured rank speeds, and when
  a re-cut is worth it (pure functions).
- :mod:`.policy`: :class:`~.policy.ReplanPolicy`, when to re-cut from the stream of measured
  speeds (pure).
- :mod:`.migrate`: a layer's weights, buffers and optimizer state to its new owner.
- :mod:`.replanning`: :class:`~.replanning.Replanner`, the runner's hook that re-plans
  between steps (``PipelineRunner(..., hooks=[replanner])``).
"""

from nobubble.pipeline.runtime.elastic.partition import balanced_sizes, replan_decision
from nobubble.pipeline.runtime.elastic.policy import ReplanPolicy
from nobubble.pipeline.runtime.elastic.replanning import Replanner, StepRecord

__all__ = ["Replanner", "ReplanPolicy", "StepRecord", "balanced_sizes", "replan_decision"]
