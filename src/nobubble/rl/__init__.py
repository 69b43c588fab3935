"""Asynchronous RL: one entry point, :func:`train` (:mod:`nobubble.rl.entry`), for two
producers of experience on one ledger and one set of weight versions - the running system
:mod:`nobubble.rl.system` (tasks, policy, reward; ``train(RunConfig(...))``) and
environments :mod:`nobubble.rl.actor_learner` (gymnasium, multi-turn text under IMPALA, SEED
RL or Sample Factory; ``train(EnvRunConfig(...))``), both an ``RLConfig`` - each returning a
:class:`RunResult`. Exported: the entry points, the task run's stage settings and presets
(functions that return a config). The algorithm toolbox is :mod:`nobubble.rl.algo`.
"""

from __future__ import annotations

from typing import Any

# imported on first use: ``import nobubble.rl`` stays light
_SYSTEM = {
    "train": "nobubble.rl.entry",
    "comparison": "nobubble.rl.entry",
    "RLConfig": "nobubble.rl.system.config",
    "RunConfig": "nobubble.rl.system.config",
    "TrainerConfig": "nobubble.rl.system.config",
    "RolloutConfig": "nobubble.rl.system.config",
    "RewardConfig": "nobubble.rl.system.config",
    "conservative": "nobubble.rl.system.config.presets",
    "aggressive": "nobubble.rl.system.config.presets",
    "RunResult": "nobubble.rl.system.result",
    "EnvRunConfig": "nobubble.rl.actor_learner.config",
    "WorkerError": "nobubble.rl.system.engines.worker",
    "RESULT_KEYS": "nobubble.rl.system.result",
    "RewardSource": "nobubble.rl.system.rewards",
    "TaskSpec": "nobubble.rl.system.tasks",
}
__all__ = list(_SYSTEM)


def __getattr__(name: str) -> Any:
    if name in _SYSTEM:
        import importlib

        return getattr(importlib.import_module(_SYSTEM[name]), name)
    raise AttributeError(f"module 'nobubble.rl' has no attribute {name!r}")
