"""Asynchronous RL and the algorithmic corrections it needs.

- :mod:`nobubble.rl.algo`: the algorithm toolbox (advantages, losses, V-trace, corrections,
  staleness, replay, aggregation, presets); its names are re-exported here.
- :mod:`nobubble.rl.system`: the running system (tasks, policy, rollout, reward, trainer,
  experience buffer, weight sync, orchestrator, engines) built on the toolbox. Its entry
  point is :func:`train` (``train(RunConfig(...)) -> RunResult``), exported here.
"""

from __future__ import annotations

from typing import Any

from nobubble.rl.algo import *  # noqa: F403  (the toolbox is this package's public API)
from nobubble.rl.algo import __all__ as _algo_all

# the running system's entry points, imported on first use (``import nobubble.rl`` stays light)
_SYSTEM = {
    "train": "nobubble.rl.system.orchestrator",
    "RunConfig": "nobubble.rl.system.config",
    "RunResult": "nobubble.rl.system.result",
    "RewardSource": "nobubble.rl.system.rewards",
    "TaskSpec": "nobubble.rl.system.tasks.spec",
}
__all__ = [*_algo_all, *_SYSTEM]


def __getattr__(name: str) -> Any:
    if name in _SYSTEM:
        import importlib

        return getattr(importlib.import_module(_SYSTEM[name]), name)
    raise AttributeError(f"module 'nobubble.rl' has no attribute {name!r}")
