"""One RL run's configuration, typed, checked when built (:mod:`.base`) and torch-free: a
task run (:mod:`.run`), its stages' settings (:mod:`.stages`) and the recipes (:mod:`.presets`).
"""

from __future__ import annotations

from nobubble.rl.system.config.base import RLConfig, describe_value
from nobubble.rl.system.config.run import (
    AGGREGATIONS,
    ALGOS,
    DEFAULT_STALENESS,
    ENGINES,
    MODES,
    RunConfig,
)
from nobubble.rl.system.config.stages import (
    STALENESS_WEIGHTS,
    LearnerConfig,
    RewardConfig,
    RolloutConfig,
    TrainerConfig,
)

__all__ = [
    "RLConfig", "RunConfig", "LearnerConfig", "TrainerConfig", "RolloutConfig", "RewardConfig",
    "describe_value",
    "ALGOS", "AGGREGATIONS", "DEFAULT_STALENESS", "ENGINES", "MODES", "STALENESS_WEIGHTS",
]  # fmt: skip
