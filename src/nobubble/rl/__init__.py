"""Asynchronous RL: one entry point, :func:`train`, for a task run (``RunConfig``,
:mod:`nobubble.rl.system`) or an environment run (``EnvRunConfig``,
:mod:`nobubble.rl.actor_learner`), both returning a :class:`RunResult`; exported with the
stage settings and presets. The algorithm toolbox is :mod:`nobubble.rl.algo`.
"""

from __future__ import annotations

from typing import Any

# imported on first use: ``import nobubble.rl`` stays light
_EXPORTS = {
    "nobubble.rl.entry": "train comparison",
    "nobubble.rl.system.config": "RLConfig RunConfig TrainerConfig RolloutConfig RewardConfig",
    "nobubble.rl.system.config.presets": "conservative aggressive",
    "nobubble.rl.system.result": "RunResult RESULT_KEYS",
    "nobubble.rl.actor_learner.config": "EnvRunConfig",
    "nobubble.rl.system.engines.worker": "WorkerError",
    "nobubble.rl.system.rewards": "RewardSource",
    "nobubble.rl.system.tasks": "TaskSpec",
}
_SYSTEM = {name: module for module, names in _EXPORTS.items() for name in names.split()}
__all__ = list(_SYSTEM)


def __getattr__(name: str) -> Any:
    if name in _SYSTEM:
        import importlib

        return getattr(importlib.import_module(_SYSTEM[name]), name)
    raise AttributeError(f"module 'nobubble.rl' has no attribute {name!r}")
