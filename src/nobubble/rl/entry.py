"""``nobubble.rl.train``: one entry point for both producers of experience.

Both producers' configs are :class:`~nobubble.rl.system.config.RLConfig` (seed, steps,
time budget, max staleness, declared once). A :class:`~nobubble.rl.system.config.RunConfig`
trains a policy on a task (groups of responses, rewards from verifiers; sync, one-step-off
or fully-async, on the local engine or Ray); an :class:`~nobubble.rl.actor_learner.config.EnvRunConfig` trains one on an
environment (IMPALA, SEED RL or Sample Factory). Both keep one ledger, prove their weight
versions and return one result type, :class:`~nobubble.rl.system.result.RunResult`, whose
``to_json()`` has the same top-level keys (:data:`~nobubble.rl.system.result.RESULT_KEYS`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from nobubble.rl.system.config import RLConfig
    from nobubble.rl.system.result import RunResult

__all__ = ["train"]


def train(
    config: RLConfig,
    *,
    on_step: Callable[[int, dict[str, float]], None] | None = None,
) -> RunResult:
    """Train ``config``'s policy; returns what the run measured.

    Args:
        config: a task run (``RunConfig``) or an environment run (``EnvRunConfig``).
        on_step: called in the driver as ``on_step(version, metrics)`` after every learner
            update (and, for environments, every evaluation).
    Raises:
        TypeError: ``config`` is neither.

    Call it under ``if __name__ == "__main__":``: workers and actors are processes, and a
    ``spawn`` start imports the calling script again in each.
    """
    from nobubble.rl.actor_learner.config import EnvRunConfig
    from nobubble.rl.system.config import RunConfig

    if isinstance(config, EnvRunConfig):
        from nobubble.rl.actor_learner.run import run as run_env

        return run_env(config, on_step=on_step)
    if isinstance(config, RunConfig):
        from nobubble.rl.system.orchestrator import run

        return run(config, on_step=on_step)
    raise TypeError(f"train: config={config!r}; pass a RunConfig (a task) or an EnvRunConfig")
