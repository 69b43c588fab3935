"""Re-planning while training: the layers re-cut over the ranks from live costs.

- :mod:`.partition`: the least-bottleneck contiguous cut for measured rank speeds, and when
  a re-cut is worth it (pure functions).
- :mod:`.policy`: :class:`~.policy.ReplanPolicy`, when to re-cut from the stream of measured
  speeds (pure).
- :mod:`.migrate`: a layer's weights, buffers and optimizer state to its new owner.
- :mod:`.replanning`: :class:`~.replanning.ReplanningPipeline`, the training loop's object.
"""

from nobubble.pipeline.runtime.elastic.partition import balanced_sizes, replan_decision
from nobubble.pipeline.runtime.elastic.policy import ReplanPolicy
from nobubble.pipeline.runtime.elastic.replanning import ReplanningPipeline, StepRecord

__all__ = ["ReplanningPipeline", "ReplanPolicy", "StepRecord", "balanced_sizes", "replan_decision"]
