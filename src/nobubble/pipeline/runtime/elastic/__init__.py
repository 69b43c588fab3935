"""Re-planning while training: the layers re-cut over the ranks from live costs
(:mod:`.partition` the cut's arithmetic, :mod:`.policy` when to re-cut, :mod:`.migrate` the
move, :mod:`.replanning` the runner's hook).
"""

from nobubble.pipeline.runtime.elastic.partition import balanced_sizes, replan_decision
from nobubble.pipeline.runtime.elastic.policy import ReplanPolicy
from nobubble.pipeline.runtime.elastic.replanning import Replanner, StepRecord

__all__ = ["Replanner", "ReplanPolicy", "StepRecord", "balanced_sizes", "replan_decision"]
