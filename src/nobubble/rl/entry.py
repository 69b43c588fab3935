"""The RL entry points: :func:`train` a task's RunConfig or an EnvRunConfig, the runs of
a :func:`comparison` (``rl compare``), :func:`serve_reward` over HTTP, and the checks of a
run before any work (its user modules, budgets and policy; an env run's config from its
options): every refusal is one ValueError naming the flag."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any, cast

from nobubble.budget import check_budget, check_steps
from nobubble.imports import is_import_path, load_user_object

if TYPE_CHECKING:
    from nobubble.rl.actor_learner.config import Arch
    from nobubble.rl.system.config import RLConfig
    from nobubble.rl.system.result import RunResult
    from nobubble.rl.system.rewards import RewardServer

__all__ = ["check_run", "comparison", "env_config", "import_run_objects", "serve_reward", "train"]

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


# the built-in tasks' sequences (prompt + response) stay under this many tokens and symbols
_SEQ_BOUND, _VOCAB_BOUND = 64, 32
STEP_S = 0.01
"""The fastest learner update of an RL run: a task's (a tiny policy, a tiny batch) and an
environment run's (512 env steps, 4 epochs) both take 10 ms."""


def import_run_objects(task: str | None = None, policy: str | None = None,
                       rewards: tuple[str, ...] = ()) -> None:  # fmt: skip
    """Import the user modules an RL run names (``--task``, ``--policy``, each ``--reward``)
    before anything else reads them (see :func:`load_user_object`)."""
    # (what, spec, the prefix of its built-in specs that are no import path)
    specs = [("task", task or "", "rg:"), ("policy", policy or "", "hf:")]
    specs += [("reward", text.rpartition("=")[0] or text, "") for text in rewards]
    for what, spec, builtin in specs:
        if is_import_path(spec) and not (builtin and spec.startswith(builtin)):
            load_user_object(f"--{what}", spec, what)


def env_config(env: str, options: Sequence[str] = (), **fields: Any) -> Any:
    """The EnvRunConfig of ``env`` with ``fields``: a text env's from its ``options``
    (``KEY=VALUE``, the value JSON when it parses), a gymnasium id's (no options) with
    ``target_return`` defaulting to its spec's ``reward_threshold``. ValueError on a bad
    option or an unknown id."""
    from nobubble.rl.actor_learner.config import EnvRunConfig
    from nobubble.rl.actor_learner.text import is_text_env, text_env_config

    if is_text_env(env):
        parsed: dict[str, Any] = {}
        for option in options:
            key, sep, value = option.partition("=")
            if not sep or not key.isidentifier():
                raise ValueError(f"--env-option {option!r}: write KEY=VALUE, e.g. max_turns=4")
            try:
                parsed[key] = json.loads(value)
            except json.JSONDecodeError:
                parsed[key] = value
        return text_env_config(env, parsed, **fields)
    if options:
        raise ValueError(f"--env-option is for text envs; {env!r} is a gymnasium id")
    if "target_return" not in fields:  # looked up only when needed: it builds the env's spec
        import gymnasium

        try:
            threshold = gymnasium.spec(env).reward_threshold
        except Exception as err:  # gymnasium's unknown-id errors are not ValueErrors
            raise ValueError(f"--env {env!r}: {err}") from None
        fields["target_return"] = None if threshold is None else float(threshold)
    return EnvRunConfig(env=env, **fields)


def check_run(cfg: Any, *, force: bool, timed: bool) -> None:
    """Refuse an RL run (a RunConfig or an EnvRunConfig) past its process and memory budget
    (a task run's logits and policy, an env run's envs), or unless ``timed`` its ``--steps``
    budget, a Ray ``--address`` that does not answer, an env its policy cannot take."""
    if hasattr(cfg, "task"):
        data = 5 * cfg.batch_groups * cfg.group_size * _SEQ_BOUND * _VOCAB_BOUND * 4
        processes = 1 + cfg.num_rollout_workers + cfg.learners
        check_budget("rl", processes=processes, data_bytes=data, force=force)
        _check_policy(cfg, copies=processes, force=force)
        if cfg.engine == "ray" and cfg.ray_address:  # a cluster that is not there: bad input
            from nobubble.distributed import WorkerError
            from nobubble.rl.system.engines.ray import check_ray_address

            try:
                check_ray_address(cfg.ray_address)
            except WorkerError as err:
                raise ValueError(str(err)) from None
    else:
        data = cfg.actors * cfg.envs_per_actor * 50e3
        check_budget("rl", processes=1 + cfg.actors, data_bytes=data, force=force)
        from nobubble.rl.actor_learner.model import env_spaces

        try:
            env_spaces(cfg.env)
        except Exception as err:
            if type(err).__module__.startswith("gymnasium"):
                raise ValueError(f"--env {cfg.env!r}: {err}") from None
            raise
    if cfg.steps is not None and not timed:
        check_steps("rl", "--steps", cfg.steps, STEP_S, hint=", give --time-budget S",
                    force=force)  # fmt: skip


def _check_policy(cfg: Any, *, copies: int, force: bool) -> None:
    """Build ``cfg``'s policy on the meta device: refuse settings it cannot be built with,
    and a model whose ``copies`` copies of weights, gradients and Adam's two moments pass the
    memory budget (``hf:DIR`` is not built here)."""
    import torch

    if isinstance(cfg.policy, str) and cfg.policy.startswith("hf:"):
        return
    task = cfg.make_task()
    settings = json.dumps(cfg.policy_kwargs)
    try:
        with torch.device("meta"):
            model = cfg.build_policy(task)
    except ValueError:
        raise
    except Exception as err:
        text = " ".join(str(err).split())
        raise ValueError(f"--policy {cfg.policy} with --policy-kwargs {settings}: building it "
                         f"raised {type(err).__name__}: {text}") from None  # fmt: skip
    params = sum(p.numel() for p in model.parameters())
    try:
        check_budget("rl", processes=1, data_bytes=16.0 * params * copies, force=force)
    except ValueError as err:
        raise ValueError(f"{err} (the policy has {params:,} parameters with --policy-kwargs "
                         f"{settings})") from None  # fmt: skip
