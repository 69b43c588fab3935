"""Asynchronous RL and the algorithmic corrections it needs.

One entry point, :func:`train` (:mod:`nobubble.rl.entry`), for two producers of experience:

- :mod:`nobubble.rl.system`: the running system (tasks, policy, rollout, reward, trainer,
  experience buffer and its ledger, weight sync, orchestrator, engines):
  ``train(RunConfig(...)) -> RunResult``;
- :mod:`nobubble.rl.actor_learner`: environments (gymnasium, multi-turn text) under IMPALA,
  SEED RL or Sample Factory, on the same ledger and weight versions:
  ``train(EnvRunConfig(...)) -> RunResult``.

Both configs are an ``RLConfig``: the settings both producers have (seed, steps, time budget,
max staleness, threads) are declared and checked there once. This package exports only the entry
points, the task run's typed stage settings
(``TrainerConfig``, ``RolloutConfig``, ``RewardConfig``) and its presets, functions that return
a config (``aggressive(RunConfig(mode="fully-async"))``). The algorithm toolbox the system is
built on, :mod:`nobubble.rl.algo` (advantages, losses, V-trace, staleness, replay,
aggregation), is imported from there
(``from nobubble.rl.algo import ppo_policy_loss``).
"""

from __future__ import annotations

from typing import Any

# the running system's entry points, imported on first use (``import nobubble.rl`` stays light)
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
    "TaskSpec": "nobubble.rl.system.tasks.spec",
}
__all__ = list(_SYSTEM)


def __getattr__(name: str) -> Any:
    if name in _SYSTEM:
        import importlib

        return getattr(importlib.import_module(_SYSTEM[name]), name)
    raise AttributeError(f"module 'nobubble.rl' has no attribute {name!r}")
