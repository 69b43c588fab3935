"""``nobubble rl``: train with a synchronous or asynchronous schedule, compare the schedules.

``nobubble rl train`` runs one configuration of one of two producers: a task (``--task``,
LLM-style groups; the default) or an environment (``--env``, :mod:`nobubble.cli.rl_env`).
The flags both have mean the same on both (``--max-staleness``, ``--time-budget``,
``--steps`` = learner updates, ``--seed``, ``--out``, ``--json``), and so do the JSON's
top-level keys; a flag of the other producer is refused. It prints accuracy (or return),
samples/s, staleness and idle ratios and writes a PNG of the curves (tasks: also a Chrome
trace of the stages' busy spans). ``--task``, ``--policy`` and ``--reward`` take the user's
own task, model factory and verifiers by import path; ``--checkpoint-dir`` / ``--resume``
make a run survive a kill; ``nobubble rl reward-server`` serves a reward function over HTTP.
``nobubble rl compare`` runs the three modes (``--env``: the three architectures) on the same
budget and prints a table and a plot; ``--ablation`` turns each lag fix on alone and all
together at each max staleness of ``--etas`` (:func:`nobubble.rl.system.config.presets.ablation`).
"""

from __future__ import annotations

import argparse
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from nobubble.cli.preflight import (
    check_task_run,
    import_run_objects,
    json_object,
    load_user_object,
    probability,
)
from nobubble.cli.rl_env import add_env_arguments, check_producer_flags, run_env
from nobubble.cli.rl_partial import add_partial_flags, partial_settings
from nobubble.cli.util import (
    ArgumentParser,
    add_json_flag,
    nonneg_float,
    nonneg_int,
    output_dir,
    positive_float,
    positive_int,
    print_json,
    print_table,
)
from nobubble.files import claim_output
from nobubble.rl.system.config import (
    AGGREGATIONS,
    ALGOS,
    MODES,
    STALENESS_WEIGHTS,
    RewardConfig,
    RunConfig,
    TrainerConfig,
)
from nobubble.rl.system.config.presets import PRESETS


def register(parser: argparse.ArgumentParser) -> None:
    parser.set_defaults(group_parser=parser)
    sub = parser.add_subparsers(
        dest="rl_command", metavar="SUBCOMMAND", parser_class=ArgumentParser
    )

    train = sub.add_parser("train", help="one RL run on a task or an environment")
    _common(train)
    add_env_arguments(train)
    train.add_argument("--mode", choices=MODES, default="sync")
    train.add_argument("--algo", choices=ALGOS, default=None, help="default grpo (or the preset's)")
    for add_flags in (_lag_flags, _learner_flags, add_partial_flags):
        add_flags(train)
    ck = train.add_argument_group("checkpoints and recovery")
    ck.add_argument(
        "--checkpoint-dir", type=output_dir, default=None, metavar="DIR", help="checkpoint folder"
    )
    ck.add_argument(
        "--checkpoint-every",
        type=nonneg_int,
        default=0,
        metavar="N",
        help="checkpoint every N steps (and at the last step); 0 = the last step only",
    )
    resume = ck.add_mutually_exclusive_group()
    resume.add_argument(
        "--resume", action="store_true", help="continue from the newest checkpoint in DIR"
    )
    resume.add_argument("--resume-or-start", action="store_true",
                        help="continue from the newest checkpoint in DIR, or start fresh when "
                        "there is none (a job that is restarted after a kill)")  # fmt: skip
    ck.add_argument(
        "--restart-workers",
        action="store_true",
        help="restart a rollout or reward worker that dies and requeue its groups",
    )
    train.set_defaults(func=_train, producer_parser=train)

    server = sub.add_parser(
        "reward-server", help="serve a reward function over HTTP (POST /score), for --reward-url"
    )
    src = server.add_mutually_exclusive_group(required=True)
    src.add_argument("--reward", metavar="MODULE:FN", help="fn(prompt, response) -> float")
    src.add_argument("--task", help="serve this task's reward (a name or MODULE:ATTR)")
    server.add_argument("--host", default="127.0.0.1")
    server.add_argument("--port", type=nonneg_int, default=8000, help="0 = any free port")
    server.set_defaults(func=_reward_server)

    compare = sub.add_parser("compare", help="the three modes (--env: architectures) on the "
                             "same budget: table + plot")  # fmt: skip
    _common(compare)
    add_env_arguments(compare, arch=False)
    compare.add_argument(
        "--ablation",
        action="store_true",
        help="each lag fix alone and all together, at each --etas, with a slow trainer",
    )
    compare.add_argument("--etas", default="8,16", metavar="LIST",
                         help="max staleness values of the ablation (default 8,16)")  # fmt: skip
    compare.set_defaults(func=_compare, producer_parser=compare)


def _lag_flags(p: argparse.ArgumentParser) -> None:
    lag = p.add_argument_group("lag control (each overrides --preset)")
    lag.add_argument("--preset", choices=tuple(PRESETS), default=None,
                     help="the source's recipes")  # fmt: skip
    lag.add_argument(
        "--drop-staleness", type=nonneg_int, default=None, metavar="K",
        help="drop samples older than K versions (default: the staleness bound)",
    )  # fmt: skip
    lag.add_argument(
        "--staleness-weighting", choices=STALENESS_WEIGHTS, default=None,
        help="weight each sample's loss by its age: 1/(1+lag) or 0.5**lag",
    )  # fmt: skip
    lag.add_argument("--kl-coef", type=nonneg_float, default=None,
                     help="KL penalty to a reference policy")  # fmt: skip
    lag.add_argument(
        "--kl-refresh-every", type=nonneg_int, default=None, metavar="N",
        help="refresh the KL reference every N steps (0 = the frozen initial policy)",
    )  # fmt: skip
    lag.add_argument(
        "--sync-every", type=nonneg_int, default=0, metavar="N",
        help="force a full sync every N steps (0 = never)",
    )  # fmt: skip
    lag.add_argument("--replay", choices=("none", "uniform", "prioritized"), default=None)
    lag.add_argument("--replay-capacity", type=nonneg_int, default=None, metavar="G",
                     help="groups kept")  # fmt: skip
    lag.add_argument(
        "--replay-groups", type=nonneg_int, default=None, metavar="G",
        help="groups drawn from the replay per step",
    )  # fmt: skip


def _learner_flags(p: argparse.ArgumentParser) -> None:
    grp = p.add_argument_group("many learners")
    grp.add_argument(
        "--learners", type=positive_int, default=1, metavar="L",
        help="trainer processes in one gloo group, each on a share of the batch",
    )  # fmt: skip
    grp.add_argument(
        "--aggregation", choices=AGGREGATIONS, default="sync",
        help="sync: all-reduce; async: applied on learner 0 as they arrive; "
        "local-sgd: average every H steps; staleness: async, x 1/(1+staleness)",
    )  # fmt: skip
    grp.add_argument(
        "--local-sgd-every", type=positive_int, default=None, metavar="H",
        help="local-sgd's averaging period in steps (default 4)",
    )  # fmt: skip


def _lag_settings(args: argparse.Namespace) -> tuple[dict[str, Any], dict[str, Any]]:
    """The lag-control flags that were given (None = leave to the preset): the run's
    settings and the trainer's."""
    names = ("max_staleness", "algo", "drop_staleness", "replay", "replay_capacity",
             "replay_groups")  # fmt: skip
    run = {name: getattr(args, name) for name in names if getattr(args, name) is not None}
    if run.get("replay") == "none":  # over a preset's replay: none of its sizes either
        run = {"replay_capacity": 0, "replay_groups": 0, **run}
    trainer = {
        name: getattr(args, name)
        for name in ("staleness_weighting", "kl_coef", "kl_refresh_every")
        if getattr(args, name) is not None
    }
    return run, trainer


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--task",
        default=None,
        help="digits | sum | rg:<reasoning-gym name> | MODULE:ATTR | FILE.py:ATTR (default "
        "digits, unless --env)",
    )
    p.add_argument(
        "--max-staleness", type=nonneg_int, default=None, metavar="N",
        help="versions a sample may lag (default: sync 0, one-step-off 1, fully-async 4; "
        "--env 4)",
    )  # fmt: skip
    p.add_argument(
        "--task-kwargs", type=json_object, default={}, metavar="JSON", help="the task's settings"
    )
    p.add_argument(
        "--policy",
        default="char",
        help="char | gpt2 (Hugging Face, from a config) | hf:DIR | MODULE:FACTORY (default char)",
    )
    p.add_argument(
        "--policy-kwargs",
        type=json_object,
        default={},
        metavar="JSON",
        help="the policy's settings",
    )
    p.add_argument(
        "--reward",
        action="append",
        default=[],
        metavar="FN[=W]",
        help="a reward source, repeatable, summed with weights: task | MODULE:FN (default task)",
    )
    p.add_argument(
        "--reward-url", default=None, metavar="URL", help="a remote reward service, POST /score"
    )
    p.add_argument("--engine", choices=("local", "ray"), default="local")
    p.add_argument(
        "--generators", type=positive_int, default=1, metavar="N",
        help="rollout workers, each holding its own weight version",
    )  # fmt: skip
    p.add_argument(
        "--address", default=None, help="Ray cluster address (default: start a local Ray)"
    )
    p.add_argument("--steps", type=positive_int, default=None,
                   help="learner updates (default: tasks 300; --env: the other budgets)")  # fmt: skip
    p.add_argument("--seed", type=nonneg_int, default=0)
    p.add_argument(
        "--time-budget", type=positive_float, default=None, metavar="S", help="stop after S seconds"
    )
    p.add_argument(
        "--target-accuracy",
        type=positive_float,
        default=None,
        help="stop once the eval accuracy reaches this",
    )
    p.add_argument("--batch-groups", type=positive_int, default=None, help="groups per step")
    p.add_argument("--group-size", type=positive_int, default=None, help="responses per prompt")
    p.add_argument("--eval-every", type=positive_int, default=None, help="steps between evals")
    p.add_argument("--reward-delay", type=nonneg_float, default=0.0, help="seconds per reward call")
    p.add_argument(
        "--reward-failure-rate",
        type=probability,
        default=0.0,
        help="probability that a reward attempt raises",
    )
    p.add_argument(
        "--trainer-delay",
        type=nonneg_float,
        default=0.0,
        help="extra seconds per trainer step (a slow trainer)",
    )
    p.add_argument(
        "--force", action="store_true", help="run past the process, memory and --steps budgets"
    )
    p.add_argument(
        "--out", type=output_dir, default=Path("nobubble-out/rl"), help="artifact folder"
    )
    add_json_flag(p)


def _config(
    args: argparse.Namespace, trainer: dict[str, Any] | None = None, **over: Any
) -> RunConfig:
    """The run the common flags describe, with ``over`` (``RunConfig`` fields) and the
    trainer settings ``trainer`` laid over them."""
    kw: dict[str, Any] = {
        "task": args.task or "digits",
        "task_kwargs": args.task_kwargs,
        "policy": args.policy,
        "policy_kwargs": args.policy_kwargs,
        "rewards": tuple(args.reward),
        "reward_url": args.reward_url,
        "engine": args.engine,
        "num_rollout_workers": args.generators,
        "ray_address": args.address,
        "seed": args.seed,
        "time_budget_s": args.time_budget,
        "target_accuracy": args.target_accuracy,
    }
    for name in ("steps", "batch_groups", "group_size", "eval_every"):
        if getattr(args, name) is not None:
            kw[name] = getattr(args, name)
    kw["reward"] = RewardConfig(delay_s=args.reward_delay, failure_rate=args.reward_failure_rate)
    kw["trainer"] = TrainerConfig(delay_s=args.trainer_delay, **(trainer or {}))
    return RunConfig(**{**kw, **over})


def _train_config(args: argparse.Namespace) -> RunConfig:
    """``rl train``'s run: the flags, with ``--preset`` applied before the lag-control flags
    given with it, so that those win."""
    ckpt = {k: getattr(args, k) for k in ("checkpoint_every", "restart_workers")}
    ckpt["resume"] = "or-start" if args.resume_or_start else args.resume
    ckpt["checkpoint_dir"] = None if args.checkpoint_dir is None else str(args.checkpoint_dir)
    many = {k: getattr(args, k) for k in ("learners", "aggregation", "local_sgd_every")}
    base = {"mode": args.mode, "sync_every": args.sync_every, **ckpt, **many,
            **partial_settings(args)}  # fmt: skip
    lag, trainer = _lag_settings(args)
    if args.preset is None:
        return _config(args, trainer, **base, **lag)
    cfg = PRESETS[args.preset](_config(args, **base))
    return replace(cfg, **lag, trainer=replace(cfg.trainer, **trainer))


def _run_with_progress(cfg: RunConfig, label: str, *, quiet: bool):
    from nobubble.bench.output import progress_bar
    from nobubble.rl.system.orchestrator import run

    with progress_bar(label, total=cfg.steps, counter="step {task.completed}/{task.total}",
                      info=True, quiet=quiet) as (progress, bar):  # fmt: skip
        progress.update(bar, info="starting workers")

        def on_step(step: int, metrics: dict[str, float]) -> None:
            info = (
                f"reward {metrics.get('reward', 0):.2f} lag {metrics.get('staleness_max', 0):.0f}"
            )
            progress.update(bar, completed=step, info=info)

        return run(cfg, on_step=on_step)


def _artifacts(results: dict, out: Path, stem: str, title: str) -> dict[str, str]:
    from nobubble.rl.system.report import plot_runs, write_trace

    paths = {"plot": str(plot_runs(results, out / f"{stem}.png", title=title))}
    for label, r in results.items():
        paths[f"trace:{label}"] = str(write_trace(r, out / f"{stem}_{label}_trace.json"))
    return paths


def _train(args: argparse.Namespace) -> int:
    check_producer_flags(args, args.producer_parser)
    # the output first, before torch is imported: another live run's folder is refused at once
    with claim_output(args.out):
        return run_env(args, compare=False) if args.env is not None else _train_task(args)


def _train_task(args: argparse.Namespace) -> int:
    import_run_objects(args)
    cfg = _train_config(args)
    check_task_run(args, cfg)  # the config's checks first: they import no torch, this does
    from nobubble.rl.system.report import SUMMARY_COLUMNS, summary_row

    label = f"{cfg.mode}" + (
        f" max_staleness={cfg.effective_max_staleness}" if cfg.mode != "sync" else ""
    )
    if cfg.learners > 1:
        label += f" learners={cfg.learners} {cfg.aggregation}"
    res = _run_with_progress(cfg, label, quiet=args.json)
    paths = _artifacts({cfg.mode: res}, args.out, f"train_{cfg.mode}", label)
    if args.json:
        print_json({**res.to_json(), "artifacts": paths})
        return 0
    print_table(
        f"nobubble rl train: {cfg.task}, {cfg.algo}, {cfg.engine}",
        SUMMARY_COLUMNS,
        [summary_row(label, res)],
    )
    hist = ", ".join(f"{k}: {v}" for k, v in sorted(res.staleness_hist.items()))
    print(f"staleness histogram (samples by lag): {hist}")
    for name, p in paths.items():
        print(f"{name}: {p}")
    return 0


def _compare(args: argparse.Namespace) -> int:
    check_producer_flags(args, args.producer_parser)
    if args.env is None:
        if args.etas != args.producer_parser.get_default("etas") and not args.ablation:
            raise ValueError("--etas is read only with --ablation; add --ablation or drop --etas")
        if args.max_staleness is not None:
            raise ValueError("--max-staleness is not read by rl compare --task: each mode "
                             "takes its own bound (--ablation: --etas); drop it")  # fmt: skip
        import_run_objects(args)
    with claim_output(args.out):  # before any run starts: refuse another live run's folder
        if args.env is not None:
            return run_env(args, compare=True)
        return _ablation(args) if args.ablation else _compare_modes(args)


def _compare_modes(args: argparse.Namespace) -> int:
    runs = {m: _config(args, mode=m) for m in MODES}
    check_task_run(args, runs["sync"])
    from nobubble.rl.system.report import SUMMARY_COLUMNS, summary_row

    title, stem = "sync vs one-step-off vs fully-async (same steps)", "compare"
    results = {}
    for label, cfg in runs.items():
        results[label] = _run_with_progress(cfg, label, quiet=args.json)
    paths = _artifacts(results, args.out, stem, title)
    base = results[next(iter(results))].samples_per_s
    if args.json:
        print_json(
            {
                "runs": {k: r.to_json() for k, r in results.items()},
                "speedup_vs_first": {k: r.samples_per_s / base for k, r in results.items()},
                "artifacts": paths,
            }
        )
        return 0
    rows = [summary_row(k, r) + [f"{r.samples_per_s / base:.2f}x"] for k, r in results.items()]
    print_table(title, [*SUMMARY_COLUMNS, "speed"], rows)
    for name, p in paths.items():
        print(f"{name}: {p}")
    return 0


def _reward_server(args: argparse.Namespace) -> int:
    from nobubble.rl.system.rewards.server import serve_rewards

    if args.port > 65535:
        raise ValueError(f"--port {args.port} must be in 0..65535")
    if args.task is not None:
        from nobubble.rl.system.tasks.spec import resolve_task

        import_run_objects(args)
        fn = resolve_task(args.task).reward
    else:
        from nobubble.rl.system.rewards.rewarder import check_reward_fn

        fn = load_user_object("--reward", args.reward, "reward")
        check_reward_fn(fn, args.reward)
    try:
        server = serve_rewards(fn, host=args.host, port=args.port)
    except OSError as err:
        msg = f"cannot listen on {args.host}:{args.port} ({err}); pick another --port"
        raise ValueError(msg) from None
    print(server.url, flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        return 0
    finally:
        server.close()


def _etas(text: str) -> list[int]:
    try:
        etas = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"--etas {text!r}: give integers like 8,16") from None
    if not etas or min(etas) < 1:
        raise ValueError(f"--etas {text!r}: give staleness bounds >= 1, like 8,16")
    return etas


def _ablation(args: argparse.Namespace) -> int:
    """Each lag fix alone and all together, at each eta: table, JSON and one plot per eta."""
    from nobubble.rl.system.config.presets import ablation
    from nobubble.rl.system.report import plot_runs

    etas = _etas(args.etas)
    delay = args.trainer_delay or 0.3
    if args.steps is None:
        args.steps = 150
    base = _config(args)
    runs = {(eta, fix): cfg for eta in etas for fix, cfg in ablation(base, eta, delay).items()}
    check_task_run(args, next(iter(runs.values())))
    results = {}
    for (eta, fix), cfg in runs.items():
        results[(eta, fix)] = _run_with_progress(cfg, f"eta={eta} {fix}", quiet=args.json)
    paths = {}
    for eta in etas:
        mine = {fix: r for (e, fix), r in results.items() if e == eta}
        title = f"ablation: fully-async, max staleness {eta}, trainer +{delay}s/step"
        png = plot_runs(mine, args.out / f"ablation_eta{eta}.png", title=title)
        paths[f"plot:eta{eta}"] = str(png)
    if args.json:
        runs_json = {f"eta{e}:{fix}": r.to_json() for (e, fix), r in results.items()}
        print_json({"runs": runs_json, "artifacts": paths})
        return 0
    rows = []
    for (eta, fix), r in results.items():
        t90 = r.time_to_accuracy(0.9)
        rows.append(
            [fix, eta, f"{r.final_accuracy:.3f}", "-" if t90 is None else f"{t90:.1f}",
             f"{r.samples_per_s:.0f}", r.ledger.dropped["stale"], r.ledger.reused]
        )  # fmt: skip
    cols = ["fix", "eta", "final acc", "time to 0.9 s", "samples/s", "dropped stale", "reused"]
    print_table(f"ablation ({args.steps} steps, trainer +{delay}s/step)", cols, rows)
    for name, p in paths.items():
        print(f"{name}: {p}")
    return 0
