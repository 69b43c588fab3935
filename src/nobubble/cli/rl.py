"""``nobubble rl``: ``train`` one run, ``compare`` the schedules, serve a reward over HTTP.
Every flag of ``train`` and ``compare`` is a field of a task's RunConfig or (``--env``) an
EnvRunConfig, declared in the tables below; a flag of the other producer is refused."""

from __future__ import annotations

import argparse
import functools
import json
import sys
import time
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from nobubble.cli.flags import Flag, add_config_flags, apply_flags, config_flags, flags_given, real
from nobubble.cli.util import (
    ArgumentParser,
    add_json_flag,
    nonneg_int,
    output_dir,
    positive_int,
    print_result,
)
from nobubble.files import claim_output
from nobubble.rl.actor_learner.config import EnvRunConfig  # torch-free
from nobubble.rl.entry import check_run, env_config, import_run_objects
from nobubble.rl.system.config import RunConfig
from nobubble.rl.system.config.presets import PRESETS

__all__ = ["register", "render_runs", "run_config"]


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
    checked before any work, then trained and drawn by :func:`_run`."""
    from nobubble.rl import comparison

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
        return _run(args, runs, stem=stem, title=_title(first, runs, args), groups=groups or None)


def _title(cfg: Any, runs: dict[str, Any], args: argparse.Namespace) -> str:
    if args.rl_command == "compare":
        if args.env is not None:
            return f"{args.env}: {', '.join(runs)} on the same budget (seed {cfg.seed})"
        if args.ablation:
            return (f"ablation ({cfg.steps} steps, fully-async, trainer "
                    f"+{cfg.trainer.delay_s}s/step)")  # fmt: skip
        return f"{' vs '.join(runs)} (same steps)"
    if not isinstance(cfg, RunConfig):
        return f"{cfg.arch} on {args.env} ({cfg.actors} x {cfg.envs_per_actor} envs)"
    title = f"nobubble rl train: {cfg.task}, {cfg.mode}, {cfg.algo}, {cfg.engine}"
    if cfg.mode != "sync":
        title += f", max_staleness={cfg.effective_max_staleness}"
    return title + (f", learners={cfg.learners} {cfg.aggregation}" if cfg.learners > 1 else "")


def _run(args: argparse.Namespace, configs: dict[str, Any], *, stem: str, title: str,
         groups: dict[str, list[str]] | None = None) -> int:  # fmt: skip
    """Train every config in turn (exit 1 on an actor that dies), draw the runs (one plot per
    group of labels, default all; task runs alone: a trace each) and render them."""
    from nobubble.rl import train
    from nobubble.rl.system.result import plot_runs, write_trace

    results = {}
    for label, cfg in configs.items():
        with ExitStack() as bar:  # a task run's progress bar, closed when its run ends
            # a worker's failure (WorkerError) ends the command like any failure: one line, exit 1
            results[label] = train(cfg, on_step=_progress(cfg, label, args.json, bar))
    paths = {}
    for name, labels in (groups or {"": list(results)}).items():
        png = args.out / f"{stem}{'_' + name if name else ''}.png"
        curves = {_curve_label(k.removeprefix(f"{name}:"), results[k]): results[k] for k in labels}
        paths[f"plot:{name}" if name else "plot"] = str(plot_runs(curves, png, title=title))
    for label, r in results.items():
        if r.env is None and not groups:  # a trace of each task run not in an ablation
            paths[f"trace:{label}"] = str(write_trace(r, args.out / f"{stem}_{label}_trace.json"))
    render_runs(title, results, paths, as_json=args.json, compare=args.rl_command == "compare")
    return 0


def _curve_label(label: str, r: Any) -> str:
    return label if r.env is None else f"{label} ({r.env_steps_per_s:,.0f} steps/s)"


def _progress(cfg: Any, label: str, quiet: bool,
              bar: ExitStack) -> Callable[[int, dict[str, float]], None]:  # fmt: skip
    """The ``on_step`` of a run: a task run's progress bar (on a terminal; entered on
    ``bar``), an env run's line per evaluation on stderr."""
    if not isinstance(cfg, RunConfig):
        from nobubble.rl.actor_learner.model import env_label

        print(f"training {cfg.arch} on {env_label(cfg.env)} ...", file=sys.stderr, flush=True)
        return _env_progress
    from nobubble.bench.output import progress_bar

    progress, task = bar.enter_context(progress_bar(
        label, total=cfg.steps, counter="step {task.completed}/{task.total}", info=True,
        quiet=quiet))  # fmt: skip
    progress.update(task, info="starting workers")

    def on_step(step: int, metrics: dict[str, float]) -> None:
        info = f"reward {metrics.get('reward', 0):.2f} lag {metrics.get('staleness_max', 0):.0f}"
        progress.update(task, completed=step, info=info)

    return on_step


def _env_progress(version: int, metrics: dict[str, float]) -> None:
    if "eval_return" not in metrics:
        return  # a line per evaluation, not per update
    train = f"{metrics['train_return']:.3g}" if "train_return" in metrics else "-"
    print(f"  {metrics['wall_s']:6.1f}s  {metrics['env_steps']:>9,} steps  version {version}  "
          f"train return {train}  eval {metrics['eval_return']:.3g}", file=sys.stderr,
          flush=True)  # fmt: skip


def render_runs(title: str, results: dict[str, Any], paths: dict[str, str], *, as_json: bool,
                compare: bool) -> None:  # fmt: skip
    """Print runs (label -> RunResult): JSON (one run: its ``to_json()`` and ``artifacts``; a
    comparison: ``runs`` by label, ``speedup_vs_first``, ``artifacts``) or a table with a row
    per run, captioned with (one run) its staleness histogram and the artifacts written."""
    base = next(iter(results.values())).samples_per_s or 1.0
    speedup = {k: r.samples_per_s / base for k, r in results.items()}
    doc: Any = None
    if as_json:
        runs = {k: {**r.to_json(), "artifacts": paths} for k, r in results.items()}
        doc = {"runs": runs, "speedup_vs_first": speedup, "artifacts": paths} if compare else (
            next(iter(runs.values())))  # fmt: skip
    rows = [_row(k, r) | ({"speed": f"{speedup[k]:.2f}x"} if compare else {})
            for k, r in results.items()]  # fmt: skip
    hist = next(iter(results.values())).staleness_hist
    caption = None if compare else "staleness histogram (trained samples by lag): " + (
        ", ".join(f"{k}: {v}" for k, v in sorted(hist.items())) or "-")  # fmt: skip
    print_result(as_json, doc, title, list(rows[0]), [list(row.values()) for row in rows],
                 caption=caption, files=list(paths.values()))  # fmt: skip


def _row(label: str, r: Any) -> dict[str, Any]:
    """One run's table row, by column: a task's accuracies, an env run's return and steps."""
    if r.env is None:
        target = r.config.get("target_accuracy") or 0.9
        to_target = r.time_to_accuracy(target)
        outcome = {"samples/s": f"{r.samples_per_s:,.0f}", "acc start": r.initial_accuracy,
                   "acc final": r.final_accuracy}  # fmt: skip
    else:
        target, to_target = r.target_return, r.time_to_target_s
        outcome = {"env steps/s": f"{r.env_steps_per_s:,.0f}", "env steps": f"{r.env_steps:,}",
                   "eval mean return": f"{r.eval_mean_return:.4g}"}  # fmt: skip
    dropped = sum(r.ledger.dropped.values()) - r.ledger.dropped.get("unfinished", 0)
    return {
        "run": label, "updates": r.steps, "wall s": f"{r.wall_s:.1f}", **outcome,
        f"s to {target}": "-" if to_target is None else f"{to_target:.1f}",
        "stale max": r.staleness_max,
        f"idle {'/'.join(r.idle_ratio)}": "/".join(f"{v:.0%}" for v in r.idle_ratio.values()),
        "dropped": dropped, "ledger": "ok" if r.ledger.ok else "FAIL",
    }  # fmt: skip


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
