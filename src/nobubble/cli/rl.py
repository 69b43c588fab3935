"""``nobubble rl``: ``train`` one run, ``compare`` the schedules, serve a reward over HTTP.
Every flag of ``train`` and ``compare`` is a field of a task's RunConfig or (``--env``) an
EnvRunConfig, declared in the tables below; a flag of the other producer is refused."""

from __future__ import annotations

import argparse
import functools
import json
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from nobubble.bench.rl_tables import draw_runs, render_runs, run_progress, run_title
from nobubble.cli.flags import Flag, add_config_flags, apply_flags, config_flags, flags_given, real
from nobubble.cli.util import ArgumentParser, add_json_flag, nonneg_int, output_dir, positive_int
from nobubble.files import claim_output
from nobubble.rl.actor_learner.config import EnvRunConfig  # torch-free
from nobubble.rl.entry import check_run, env_config, import_run_objects
from nobubble.rl.system.config import RunConfig
from nobubble.rl.system.config.presets import PRESETS

__all__ = ["register", "run_config"]


def _folder(text: str) -> str:
    return str(output_dir(text))


def _json_object(text: str) -> dict:
    """argparse type: a JSON object (``'{"hidden": 128}'``)."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as err:
        raise argparse.ArgumentTypeError(f"{text!r} is not JSON ({err.msg})") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"{text!r} is not a JSON object like '{{\"k\": 1}}'")
    return value


def _target_return(text: str) -> float | str:
    """``--target-return``: a finite number, or ``"none"`` (never stop early)."""
    try:
        return "none" if text.lower() == "none" else real(text)
    except argparse.ArgumentTypeError as err:
        raise argparse.ArgumentTypeError(f"{err} or 'none'") from None


TYPES: dict[str, Any] = {
    "task_kwargs": _json_object,
    "policy_kwargs": _json_object,
    "rewards": list,
}
TYPES |= {"checkpoint_dir": _folder, "target_return": _target_return}
"""The argparse type of an RL field by its name, where the check does not say it."""


def _run_flags(spec: str) -> tuple[Flag, ...]:
    """The flag rows of RunConfig's field paths in ``spec`` (:func:`config_flags`)."""
    return config_flags(RunConfig, spec, **TYPES)


SHARED_FLAGS = _run_flags("max_staleness steps seed --time-budget=time_budget_s")
"""The flags both producers read, each a field of both configs."""
TASK_FLAGS = _run_flags(
    "task task_kwargs policy policy_kwargs --reward=rewards reward_url engine "
    "--generators=num_rollout_workers --address=ray_address target_accuracy batch_groups "
    "group_size eval_every --reward-delay=reward.delay_s "
    "--reward-failure-rate=reward.failure_rate --trainer-delay=trainer.delay_s",
)
"""The task producer's flags of ``rl train`` and ``rl compare``."""
LAG_CONTROL = _run_flags(
    "drop_staleness trainer.staleness_weighting trainer.kl_coef trainer.kl_refresh_every "
    "sync_every --replay=replay.mode --replay-capacity=replay.capacity "
    "--replay-groups=replay.groups_per_step",
)
TRAIN_GROUPS = {
    "schedule": _run_flags("mode algo"),
    "lag control (each overrides --preset)": LAG_CONTROL,
    "many learners": _run_flags("learners aggregation local_sgd_every"),
    "in-flight weight updates (partial rollouts; local engine)": _run_flags(
        "partial_rollouts weight_check_every --token-delay=rollout.token_delay_s"
    ),
    "checkpoints and recovery": _run_flags("checkpoint_dir checkpoint_every restart_workers"),
}
"""``rl train``'s own task flags, by help section."""
TRAIN_FLAGS = (
    *(f for group in TRAIN_GROUPS.values() for f in group),
    ("--resume", "resume", bool, ""),
)
# the settings a preset makes: the flags that set them are laid over the preset's config
PRESET_OWNED = {"max_staleness", "algo", *(path for _, path, _, _ in LAG_CONTROL)}
# flags of one producer that are not config fields: (flag, dest)
TASK_ONLY = (("--preset", "preset"), ("--ablation", "ablation"), ("--etas", "etas"))
ENV_FLAGS = config_flags(
    EnvRunConfig,
    "arch actors envs_per_actor env_step_delay_ms loss --env-steps=max_env_steps target_return",
    **TYPES,
)
"""The environment producer's own flags (``--arch`` first: ``rl compare`` runs them all)."""


def register(parser: argparse.ArgumentParser) -> None:
    parser.set_defaults(group_parser=parser)
    sub = parser.add_subparsers(dest="rl_command", metavar="SUBCOMMAND",
                                parser_class=ArgumentParser)  # fmt: skip
    train = sub.add_parser("train", help="one RL run on a task or an environment")
    _producer_flags(train, arch=True)
    for title, flags in TRAIN_GROUPS.items():
        add_config_flags(train.add_argument_group(title), RunConfig, flags)
    train.add_argument("--preset", choices=tuple(PRESETS), default=None,
                       help="the source's lag-control recipes, applied before the flags")  # fmt: skip
    resume = train.add_mutually_exclusive_group()
    resume.add_argument("--resume", action="store_const", const=True, default=None,
                        help="continue from the newest checkpoint in DIR")  # fmt: skip
    resume.add_argument("--resume-or-start", action="store_const", const="or-start",
                        dest="resume", help="continue from the newest checkpoint in DIR, or "
                        "start fresh when there is none (a job restarted after a kill)")  # fmt: skip
    train.set_defaults(func=_train_or_compare)

    compare = sub.add_parser("compare", help="the three modes (--env: architectures) on the "
                             "same budget: table + plot")  # fmt: skip
    _producer_flags(compare, arch=False)
    compare.add_argument("--ablation", action="store_const", const=True, default=None,
                         help="each lag fix alone and all together, at each --etas, with a "
                         "slow trainer")  # fmt: skip
    compare.add_argument("--etas", type=_etas, default=None, metavar="LIST",
                         help="max staleness values of the ablation (default 8,16)")  # fmt: skip
    compare.set_defaults(func=_train_or_compare)

    server = sub.add_parser("reward-server", help="serve a reward function over HTTP (POST "
                            "/score), for --reward-url")  # fmt: skip
    src = server.add_mutually_exclusive_group(required=True)
    src.add_argument("--reward", metavar="MODULE:FN", help="fn(prompt, response) -> float")
    src.add_argument("--task", help="serve this task's reward (a name or MODULE:ATTR)")
    server.add_argument("--host", default="127.0.0.1")
    server.add_argument("--port", type=nonneg_int, default=8000, help="0 = any free port")
    server.set_defaults(func=_reward_server)


def _producer_flags(p: argparse.ArgumentParser, *, arch: bool) -> None:
    """The flags ``rl train`` and ``rl compare`` share: both producers', the task's, the
    environment's (``arch``: one architecture is chosen, not all)."""
    add_config_flags(p, RunConfig, SHARED_FLAGS)
    add_config_flags(p.add_argument_group("task producer (the default)"), RunConfig, TASK_FLAGS)
    g = p.add_argument_group("environment producer (with --env; IMPALA, SEED RL, Sample Factory)")
    g.add_argument("--env", default=None, metavar="ID",
                   help="gymnasium id (CartPole-v1, Acrobot-v1) or a text env: guess-number, "
                   "rg:<task>; instead of --task")  # fmt: skip
    g.add_argument("--env-option", action="append", default=None, metavar="KEY=VALUE",
                   help="a text env's option, repeatable: high=9, max_turns=4, a reasoning-gym "
                   "config")  # fmt: skip
    add_config_flags(g, EnvRunConfig, ENV_FLAGS if arch else ENV_FLAGS[1:])
    p.add_argument("--force", action="store_true",
                   help="run past the process, memory and --steps budgets")  # fmt: skip
    p.add_argument("--out", type=output_dir, default=Path("nobubble-out/rl"),
                   help="artifact folder (default nobubble-out/rl)")  # fmt: skip
    add_json_flag(p)


def _check_producer(args: argparse.Namespace) -> bool:
    """Whether the run is on an environment; a flag the chosen producer would not read is
    refused (ValueError naming it)."""
    env = args.env is not None
    if env and args.task is not None:
        raise ValueError("--task and --env pick two producers; give one of them")
    task_only = [(f, d) for f, d, _, _ in TASK_FLAGS + TRAIN_FLAGS] + list(TASK_ONLY)
    other = task_only if env else [(f, d) for f, d, _, _ in ENV_FLAGS] + [("--env-option",
                                                                         "env_option")]  # fmt: skip
    for flag, dest in other:
        if getattr(args, dest, None) is not None:
            chosen = f"--env {args.env}" if env else "--task"
            raise ValueError(f"{flag} is not read with {chosen}; drop {flag}")
    return env


def run_config(args: argparse.Namespace) -> Any:
    """The run the flags describe (ValueError / ImportError on a bad value or a missing
    extra). With ``--env``: :func:`~nobubble.rl.entry.env_config`'s. Else a RunConfig:
    ``--preset`` is applied first and the flags that set what it sets (:data:`PRESET_OWNED`)
    are laid over its config, so that they win."""
    if args.env is not None:
        table = SHARED_FLAGS + ENV_FLAGS
        given = flags_given(table, args)
        if given.get("target_return") == "none":  # never stop early (left out: the env's)
            given["target_return"] = None
        build = functools.partial(env_config, args.env, args.env_option or ())
        return apply_flags(build, given, table)
    table = SHARED_FLAGS + TASK_FLAGS + TRAIN_FLAGS  # rl compare has no TRAIN_FLAGS: not given
    given = flags_given(table, args)
    import_run_objects(given.get("task"), given.get("policy"), given.get("rewards", ()))
    if given.get("replay.mode") == "none":  # over a preset's replay: none of its sizes either
        given = {"replay.capacity": 0, "replay.groups_per_step": 0, **given}
    preset = getattr(args, "preset", None)
    if preset is None:
        return apply_flags(RunConfig, given, table)
    base = {k: v for k, v in given.items() if k not in PRESET_OWNED}
    lag = {k: v for k, v in given.items() if k in PRESET_OWNED}
    return apply_flags(PRESETS[preset](apply_flags(RunConfig, base, table)), lag, table)


def _etas(text: str) -> tuple[int, ...]:
    """argparse type of ``--etas``: max staleness bounds >= 1, like ``8,16``."""
    return tuple(positive_int(x) for x in text.split(","))


def _train_or_compare(args: argparse.Namespace) -> int:
    """``rl train`` (one run) and ``rl compare`` (:func:`nobubble.rl.comparison`'s runs),
    checked before any work, then trained in turn, drawn and rendered."""
    from nobubble.rl import comparison, train

    env, compare = _check_producer(args), args.rl_command == "compare"
    if compare and not env and args.etas is not None and not args.ablation:
        raise ValueError("--etas is read only with --ablation; add --ablation or drop --etas")
    if compare and not env and args.max_staleness is not None:
        raise ValueError("--max-staleness is not read by rl compare --task: each mode takes "
                         "its own bound (--ablation: --etas); drop it")  # fmt: skip
    etas = (args.etas or (8, 16)) if compare and args.ablation else ()
    # the output first, before torch is imported: another live run's folder is refused at once
    with claim_output(args.out):
        config = run_config(args)
        if etas and args.steps is None:  # the ablation: 150 steps unless --steps says so
            config = apply_flags(config, {"steps": 150})
        label = config.mode if isinstance(config, RunConfig) else config.arch
        runs = comparison(config, ablation=etas) if compare else {label: config}
        first = next(iter(runs.values()))
        check_run(first, force=args.force, timed=args.time_budget_s is not None)
        # the ablation: one plot per staleness bound
        groups = {f"eta{e}": [k for k in runs if k.startswith(f"eta{e}:")] for e in etas}
        stem = ("ablation" if etas else "compare") if compare else f"train_{label}"
        title = run_title(first, list(runs), compare=compare, env=args.env, ablation=bool(etas))
        results = {}
        for label, cfg in runs.items():  # in turn; a worker's failure ends the command, exit 1
            with ExitStack() as bar:  # a task run's progress bar, closed when its run ends
                results[label] = train(cfg, on_step=run_progress(cfg, label, args.json, bar))
        paths = draw_runs(results, args.out, stem, title, groups or None)
        render_runs(title, results, paths, as_json=args.json, compare=compare)
        return 0


def _reward_server(args: argparse.Namespace) -> int:
    from nobubble.rl.entry import serve_reward

    server = serve_reward(task=args.task, reward=args.reward, host=args.host, port=args.port)
    print(server.url, flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        return 0
    finally:
        server.close()
