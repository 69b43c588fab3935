"""One RL run's configuration, typed and torch-free.

- :mod:`.base` - :class:`RLConfig`, the settings both producers have (seed, steps, time
  budget, max staleness, threads, stall timeout), each declared and checked once;
- :mod:`.run` - :class:`RunConfig`, everything one run on a task needs (an RLConfig),
  validated when built;
- :mod:`.stages` - :class:`LearnerConfig`, the learner's settings both producers have (a
  task run's trainer and an environment run are LearnerConfigs), and the settings of each
  stage (:class:`TrainerConfig`,
  :class:`RolloutConfig`, :class:`RewardConfig`) that ``RunConfig.trainer`` / ``.rollout`` /
  ``.reward`` hold;
- :mod:`.presets` - the recipes as functions that return a config
  (``aggressive(RunConfig(...))``) and the lag-fix ablation grid.
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
