"""``nobubble rl actor-learner --env ID``: actor-learner RL on a gymnasium environment.

:func:`add_env_arguments` adds the flags to a parser; :func:`run_env_train` runs
:func:`nobubble.rl.actor_learner.train` with them, shows progress on stderr and prints a
table (or ``--json``) on stdout. A bad value is one line on stderr and exit status 2; an
actor that dies is one line naming it and exit status 1.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from nobubble.cli.util import (
    add_json_flag,
    nonneg_float,
    nonneg_int,
    positive_float,
    positive_int,
    print_json,
    print_table,
)

__all__ = ["add_env_arguments", "run_env_train", "ENV_ARCHS"]

ENV_ARCHS = ("impala", "seed", "sample-factory")


def add_env_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of an actor-learner run (all optional except ``--env``)."""
    parser.add_argument("--env", required=True, help="gymnasium id, e.g. CartPole-v1")
    parser.add_argument("--arch", default="seed", help=f"one of {', '.join(ENV_ARCHS)}")
    parser.add_argument("--actors", type=positive_int, default=2, help="actor processes")
    parser.add_argument("--envs-per-actor", type=positive_int, default=8)
    parser.add_argument(
        "--env-step-delay-ms", type=nonneg_float, default=0.0,
        help="sleep per env step, a stand-in for a slow simulator",
    )  # fmt: skip
    parser.add_argument("--max-lag", type=nonneg_int, default=4, help="drop older trajectories")
    parser.add_argument("--loss", default="ppo", help="ppo (APPO) or vtrace (IMPALA)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=positive_int, default=2_000_000, help="env step budget")
    parser.add_argument("--seconds", type=positive_float, default=300.0, help="time budget")
    parser.add_argument(
        "--target-return", type=float, default=475.0,
        help="stop when the greedy eval mean reaches it (a negative value: never)",
    )  # fmt: skip
    add_json_flag(parser)


def _config(args: argparse.Namespace) -> Any:
    from nobubble.rl.actor_learner.config import EnvRunConfig

    return EnvRunConfig(
        env=args.env, arch=args.arch, actors=args.actors, envs_per_actor=args.envs_per_actor,
        env_step_delay_ms=args.env_step_delay_ms, max_lag=args.max_lag, loss=args.loss,
        seed=args.seed, max_env_steps=args.steps, max_seconds=args.seconds,
        target_return=None if args.target_return < 0 else args.target_return,
    )  # fmt: skip


def _progress(point: Any) -> None:
    train = "-" if point.train_return is None else f"{point.train_return:.1f}"
    line = f"  {point.wall_s:6.1f}s  {point.env_steps:>9,} steps  train return {train}"
    if point.eval_return is None:
        return  # a progress line per evaluation, not per update
    line += f"  eval {point.eval_return:.1f}"
    print(line, file=sys.stderr, flush=True)


def run_env_train(args: argparse.Namespace) -> int:
    """Run one actor-learner training; the exit status."""
    try:
        config = _config(args)
        from nobubble.rl.actor_learner.envs import env_spaces

        env_spaces(config.env)  # an unknown id or unsupported spaces: a usage error
    except ValueError as err:
        print(f"nobubble rl actor-learner: error: {err}", file=sys.stderr)
        return 2
    except Exception as err:  # gymnasium's unknown-id errors are not ValueErrors
        if type(err).__module__.startswith("gymnasium"):
            print(f"nobubble rl actor-learner: error: --env {args.env!r}: {err}", file=sys.stderr)
            return 2
        raise
    from nobubble.rl.actor_learner import ActorFailure, train

    print(f"training {config.arch} on {config.env} ...", file=sys.stderr, flush=True)
    try:
        result = train(config, progress=_progress)
    except ActorFailure as err:
        print(f"nobubble rl actor-learner: {err}", file=sys.stderr)
        return 1
    if args.json:
        print_json(result.to_dict())
        return 0
    _table(result)
    return 0


def _table(r: Any) -> None:
    time_to = "-" if r.time_to_target_s is None else f"{r.time_to_target_s:.1f}s"
    lags = " ".join(f"{k}:{v}" for k, v in sorted(r.lag_histogram.items()))
    dropped = ", ".join(f"{k} {v}" for k, v in r.ledger.dropped.items())
    rows = [
        ["eval mean return", f"{r.eval_mean_return:.1f} over {len(r.eval_returns)} episodes"],
        [f"time to {r.target_return}", time_to],
        ["env steps", f"{r.env_steps:,}"],
        ["env steps/s", f"{r.env_steps_per_s:,.0f}"],
        ["updates (policy version)", r.updates],
        ["idle ratio", ", ".join(f"{k} {v:.0%}" for k, v in r.idle_ratio.items())],
        ["policy lag histogram", lags or "-"],
        ["ledger", f"{r.ledger.used} used, dropped {dropped}, whole: {r.ledger.whole}"],
    ]
    print_table(f"{r.arch} on {r.env} ({r.actors} x {r.envs_per_actor} envs)", ["", ""], rows)
