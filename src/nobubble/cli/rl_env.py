"""``nobubble rl actor-learner --env ID``: actor-learner RL on a gymnasium or text environment.

``rl train --env ID`` and ``rl compare --env ID`` route here (:func:`route_env_commands`).

``--env`` is a gymnasium id (``CartPole-v1``, ``Acrobot-v1``) or a built-in multi-turn text
environment: ``guess-number`` or ``rg:<task>`` (a reasoning-gym task over several turns),
configured by ``--env-option KEY=VALUE`` (``high=9``, ``max_turns=4``, a dataset's config).
:func:`add_env_arguments` adds the flags to a parser; :func:`run_env_train` runs
:func:`nobubble.rl.actor_learner.train` with them, shows progress on stderr and prints a
table (or ``--json``) on stdout. A flag left out takes the run's default (for text envs
those of :data:`nobubble.rl.actor_learner.text.run.TEXT_DEFAULTS`); the target return
defaults to the gymnasium spec's ``reward_threshold`` (475 for CartPole-v1, -100 for
Acrobot-v1) and to a success rate of 0.8 for text envs. A bad value is one line on stderr
and exit status 2; an actor that dies is one line naming it and exit status 1.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from typing import Any

from nobubble.cli.util import (
    add_json_flag,
    nonneg_float,
    nonneg_int,
    output_file,
    positive_float,
    positive_int,
    print_json,
    print_table,
)

__all__ = [
    "add_env_arguments",
    "run_env_train",
    "parse_env_options",
    "target_return",
    "route_env_commands",
    "ENV_ARCHS",
]

ENV_ARCHS = ("impala", "seed", "sample-factory")


def route_env_commands(argv: list[str]) -> list[str]:
    """``rl train --env ID ...`` is ``rl actor-learner --env ID ...``, and ``rl compare --env
    ID ...`` is ``rl actor-learner --arch all --env ID ...`` (every architecture on one budget):
    an environment, not a task, picks the actor-learner system. Any other command is
    returned unchanged."""
    if len(argv) < 2 or argv[0] != "rl" or argv[1] not in ("train", "compare"):
        return argv
    rest = argv[2:]
    if not any(a == "--env" or a.startswith("--env=") for a in rest):
        return argv
    has_arch = any(a == "--arch" or a.startswith("--arch=") for a in rest)
    extra = ["--arch", "all"] if argv[1] == "compare" and not has_arch else []
    return ["rl", "actor-learner", *extra, *rest]


def target_return(text: str) -> float | str:
    """``--target-return``: a number, or ``"none"`` (never stop early)."""
    if text.lower() == "none":
        return "none"
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number or 'none'") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite number")
    return value


def add_env_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of an actor-learner run (all optional except ``--env``)."""
    parser.add_argument(
        "--env", required=True,
        help="gymnasium id (CartPole-v1, Acrobot-v1) or a text env: guess-number, rg:<task>",
    )  # fmt: skip
    parser.add_argument(
        "--env-option", action="append", default=[], metavar="KEY=VALUE",
        help="a text env's option, repeatable: high=9, max_turns=4, a reasoning-gym config",
    )  # fmt: skip
    parser.add_argument("--arch", default="seed",
                        help=f"one of {', '.join(ENV_ARCHS)}, or 'all': each on the same budget, "
                        "side by side (a table, and --plot)")  # fmt: skip
    parser.add_argument(
        "--plot",
        type=output_file,
        default=None,
        help="with --arch all: return against wall-clock and env steps (PNG/SVG)",
    )
    parser.add_argument("--actors", type=positive_int, default=None, help="actor processes")
    parser.add_argument("--envs-per-actor", type=positive_int, default=None)
    parser.add_argument(
        "--env-step-delay-ms", type=nonneg_float, default=None,
        help="sleep per env step, a stand-in for a slow simulator",
    )  # fmt: skip
    parser.add_argument("--max-lag", type=nonneg_int, default=None, help="drop older trajectories")
    parser.add_argument("--loss", default=None, help="ppo (APPO, the default) or vtrace (IMPALA)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=positive_int, default=None, help="env step budget")
    parser.add_argument("--seconds", type=positive_float, default=None, help="time budget")
    parser.add_argument(
        "--target-return", type=target_return, default=None,
        help="stop when the greedy eval mean reaches it ('none': never); default: the env's "
        "reward threshold (CartPole-v1 475, Acrobot-v1 -100; text envs: success 0.8)",
    )  # fmt: skip
    add_json_flag(parser)


_FLAGS = {
    "actors": "actors", "envs_per_actor": "envs_per_actor",
    "env_step_delay_ms": "env_step_delay_ms", "max_lag": "max_lag", "loss": "loss",
    "steps": "max_env_steps", "seconds": "max_seconds",
}  # fmt: skip


def parse_env_options(options: list[str]) -> dict[str, Any]:
    """``["high=9", 'operators=["+"]']`` -> ``{"high": 9, "operators": ["+"]}``: a value is
    JSON when it parses as JSON, else a string."""
    out: dict[str, Any] = {}
    for option in options:
        key, sep, value = option.partition("=")
        if not sep or not key.isidentifier():
            raise ValueError(f"--env-option {option!r}: write KEY=VALUE, e.g. max_turns=4")
        try:
            out[key] = json.loads(value)
        except json.JSONDecodeError:
            out[key] = value
    return out


def _config(args: argparse.Namespace) -> Any:
    """The run's config (ValueError / ImportError on a bad value or a missing extra)."""
    from nobubble.rl.actor_learner.config import EnvRunConfig
    from nobubble.rl.actor_learner.text.run import is_text_env, text_env_config

    run: dict[str, Any] = {"arch": args.arch, "seed": args.seed}
    run |= {field: getattr(args, flag) for flag, field in _FLAGS.items()}
    run = {k: v for k, v in run.items() if v is not None}
    if args.target_return is not None:  # None: the env's default; "none": never stop early
        run["target_return"] = None if args.target_return == "none" else args.target_return
    if is_text_env(args.env):
        return text_env_config(args.env, parse_env_options(args.env_option), **run)
    if args.env_option:
        raise ValueError(f"--env-option is for text envs; {args.env!r} is a gymnasium id")
    if args.target_return is None:
        run["target_return"] = _reward_threshold(args.env)
    return EnvRunConfig(env=args.env, **run)


def _reward_threshold(env_id: str) -> float | None:
    """The gymnasium spec's ``reward_threshold`` (None when it has none)."""
    import gymnasium

    threshold = gymnasium.spec(env_id).reward_threshold
    return None if threshold is None else float(threshold)


def _progress(point: Any) -> None:
    train = "-" if point.train_return is None else f"{point.train_return:.3g}"
    line = f"  {point.wall_s:6.1f}s  {point.env_steps:>9,} steps  train return {train}"
    if point.eval_return is None:
        return  # a progress line per evaluation, not per update
    line += f"  eval {point.eval_return:.3g}"
    print(line, file=sys.stderr, flush=True)


def run_env_train(args: argparse.Namespace) -> int:
    """Run one actor-learner training (or, with ``--arch all``, one per architecture on the
    same budget); the exit status."""
    if args.plot is not None and args.arch != "all":
        print("nobubble rl actor-learner: error: --plot draws --arch all's comparison; add "
              "--arch all or drop --plot", file=sys.stderr)  # fmt: skip
        return 2
    archs = ENV_ARCHS if args.arch == "all" else (args.arch,)
    configs = []
    try:
        for arch in archs:
            configs.append(_config(argparse.Namespace(**{**vars(args), "arch": arch})))
        config = configs[0]
        from nobubble.rl.actor_learner.envs import env_label, env_spaces

        env_spaces(config.env)  # an unknown id or unsupported spaces: a usage error
    except (ValueError, ImportError) as err:  # ImportError: a missing extra (reasoning-gym)
        print(f"nobubble rl actor-learner: error: {err}", file=sys.stderr)
        return 2
    except Exception as err:  # gymnasium's unknown-id errors are not ValueErrors
        if type(err).__module__.startswith("gymnasium"):
            print(f"nobubble rl actor-learner: error: --env {args.env!r}: {err}", file=sys.stderr)
            return 2
        raise
    from nobubble.rl.actor_learner import ActorFailure, train

    results = []
    for config in configs:
        print(f"training {config.arch} on {env_label(config.env)} ...", file=sys.stderr,
              flush=True)  # fmt: skip
        try:
            results.append(train(config, progress=_progress))
        except ActorFailure as err:
            print(f"nobubble rl actor-learner: {err}", file=sys.stderr)
            return 1
    if args.arch == "all":
        return _compare(results, args)
    if args.json:
        print_json(results[0].to_dict())
        return 0
    _table(results[0])
    return 0


def _compare(results: list[Any], args: argparse.Namespace) -> int:
    """The architectures side by side: a table (or JSON) and, with ``--plot``, the curves."""
    plot = None
    if args.plot is not None:
        from nobubble.rl.actor_learner.plot import plot_curves

        plot = str(plot_curves(results, args.plot))
    if args.json:
        print_json({"runs": [r.to_dict() for r in results], "plot": plot})
        return 0
    rows = [
        [r.arch, f"{r.eval_mean_return:.4g}",
         "-" if r.time_to_target_s is None else f"{r.time_to_target_s:.1f}",
         "-" if r.steps_to_target is None else f"{r.steps_to_target:,}",
         f"{r.env_steps_per_s:,.0f}", f"{r.idle_ratio.get('learner', 0.0):.0%}", r.max_lag]
        for r in results
    ]  # fmt: skip
    first = results[0]
    print_table(
        f"{first.env}: {', '.join(ENV_ARCHS)} on the same budget (seed {first.seed})",
        ["arch", "eval return", f"s to {first.target_return}", "steps to target", "env steps/s",
         "learner idle", "max lag"],
        rows,
        caption=f"plot: {plot}" if plot else None,
    )  # fmt: skip
    return 0


def _table(r: Any) -> None:
    time_to = "-" if r.time_to_target_s is None else f"{r.time_to_target_s:.1f}s"
    lags = " ".join(f"{k}:{v}" for k, v in sorted(r.lag_histogram.items()))
    dropped = ", ".join(f"{k} {v}" for k, v in r.ledger.dropped.items())
    rows = [
        ["eval mean return", f"{r.eval_mean_return:.4g} over {len(r.eval_returns)} episodes"],
        [f"time to {r.target_return}", time_to],
        ["env steps", f"{r.env_steps:,}"],
        ["env steps/s", f"{r.env_steps_per_s:,.0f}"],
        ["updates (policy version)", r.updates],
        ["idle ratio", ", ".join(f"{k} {v:.0%}" for k, v in r.idle_ratio.items())],
        ["policy lag histogram", lags or "-"],
        ["ledger", f"{r.ledger.used} used, dropped {dropped}, whole: {r.ledger.whole}"],
    ]
    print_table(f"{r.arch} on {r.env} ({r.actors} x {r.envs_per_actor} envs)", ["", ""], rows)
