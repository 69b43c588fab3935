"""One RL run's configuration, typed, checked when built, and torch-free.

:mod:`.base`: :class:`RLConfig`, the settings both producers have, and the check every config
field declares (:func:`~.base.setting`); :mod:`.run`: :class:`RunConfig`, a run on a task;
:mod:`.stages`: the stage settings it holds (:class:`TrainerConfig`, :class:`RolloutConfig`,
:class:`RewardConfig`) and :class:`LearnerConfig`, the learner's settings both producers have;
:mod:`.presets`: the recipes, as functions that return a config.
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
