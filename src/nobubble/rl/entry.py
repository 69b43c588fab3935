"""The RL entry points: :func:`train` a task's RunConfig or an EnvRunConfig, the runs of
a :func:`comparison` (``rl compare``), and :func:`serve_reward` over HTTP."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, cast

if TYPE_CHECKING:
    from nobubble.rl.actor_learner.config import Arch
    from nobubble.rl.system.config import RLConfig
    from nobubble.rl.system.result import RunResult
    from nobubble.rl.system.rewards import RewardServer

__all__ = ["comparison", "serve_reward", "train"]

ABLATION_TRAINER_DELAY_S = 0.3
"""The ablation's trainer slowdown per step unless the config has one: the generator then
runs ahead to the staleness bound, where the lag fixes matter."""


def train(
    config: RLConfig,
    *,
    on_step: Callable[[int, dict[str, float]], None] | None = None,
) -> RunResult:
    """Train the policy of ``config`` (a task's ``RunConfig`` or an ``EnvRunConfig``, else
    TypeError) and return what the run measured; ``on_step(version, metrics)`` is called in
    the driver after every learner update (and every environment evaluation). Call it under
    ``if __name__ == "__main__":``: a ``spawn`` start imports the script again in each worker.
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


def comparison(config: RLConfig, *, ablation: Sequence[int] = ()) -> dict[str, RLConfig]:
    """The runs of one comparison on ``config``'s budget, by label: a task run in each mode, an
    environment run in each architecture; or, with ``ablation`` (max staleness bounds, task
    runs only, else ValueError), each lag fix alone and all together at each bound
    (:func:`~nobubble.rl.system.config.presets.ablation`), labelled ``eta<K>:<fix>``, the
    trainer slowed by :data:`ABLATION_TRAINER_DELAY_S` a step unless ``config`` slows it.
    TypeError for a config that is neither a RunConfig nor an EnvRunConfig."""
    from nobubble.rl.actor_learner.config import ARCHS, EnvRunConfig
    from nobubble.rl.system.config import MODES, RunConfig
    from nobubble.rl.system.config.presets import ablation as lag_fixes

    if not isinstance(config, (RunConfig, EnvRunConfig)):
        raise TypeError(f"comparison: config={config!r}; pass a RunConfig (a task) or an "
                        "EnvRunConfig")  # fmt: skip
    if isinstance(config, EnvRunConfig) and not ablation:
        return {arch: replace(config, arch=cast("Arch", arch)) for arch in ARCHS}
    if isinstance(config, EnvRunConfig):
        raise ValueError(f"comparison: config={config!r}; the lag-fix ablation is of task runs "
                         "(a RunConfig); drop it for an env run")  # fmt: skip
    if not ablation:
        return {mode: replace(config, mode=mode) for mode in MODES}
    if min(ablation) < 1:
        raise ValueError(f"ablation={list(ablation)}: give staleness bounds >= 1, like 8, 16")
    delay = config.trainer.delay_s or ABLATION_TRAINER_DELAY_S
    return {f"eta{eta}:{fix}": cfg for eta in ablation
            for fix, cfg in lag_fixes(config, eta, delay).items()}  # fmt: skip


def serve_reward(*, task: str | None = None, reward: str | None = None,
                 host: str = "127.0.0.1", port: int = 8000) -> RewardServer:  # fmt: skip
    """Start serving one reward over HTTP (``POST /score``, for ``--reward-url``): ``task``'s
    (a name or ``MODULE:ATTR``) or the function ``reward`` names (``MODULE:FN``,
    ``fn(prompt, response) -> float``). Close the server it returns. Raises ValueError on a
    port outside 0..65535, a reward that cannot be loaded, or an address taken."""
    from nobubble.rl.preflight import import_run_objects, load_user_object
    from nobubble.rl.system.rewards import RewardServer, check_reward_fn
    from nobubble.rl.system.tasks import resolve_task

    if not 0 <= port <= 65535:
        raise ValueError(f"--port {port} must be in 0..65535")
    if task is not None:
        import_run_objects(task)
        fn = resolve_task(task).reward
    else:
        fn = load_user_object("--reward", str(reward), "reward")
        check_reward_fn(fn, str(reward))
    try:
        return RewardServer(fn, host=host, port=port)
    except OSError as err:
        raise ValueError(f"cannot listen on {host}:{port} ({err}); pick another --port") from None
