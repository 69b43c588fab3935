"""``nobubble rl train|compare --env ID``: the environment producer's flags and its runs.

``--env`` is a gymnasium id (``CartPole-v1``, ``Acrobot-v1``) or a built-in multi-turn text
environment: ``guess-number`` or ``rg:<task>`` (a reasoning-gym task over several turns),
configured by ``--env-option KEY=VALUE`` (``high=9``, ``max_turns=4``, a dataset's config).
The flags both producers have (``--max-staleness``, ``--time-budget``, ``--steps`` = learner
updates, ``--seed``, ``--out``, ``--json``) are ``rl train``'s own; :func:`add_env_arguments`
adds the environment's, and :func:`check_producer_flags` refuses a flag of the other
producer. :func:`run_env` runs :func:`nobubble.rl.train` (``rl compare``: every
architecture on the same budget), shows progress on stderr and prints a table or ``--json``
(the keys of every RL run, :data:`nobubble.rl.system.result.RESULT_KEYS`). The target
return defaults to the gymnasium spec's ``reward_threshold`` (475 for CartPole-v1, -100 for
Acrobot-v1) and to a success rate of 0.8 for text envs. An actor that dies is one line
naming it and exit status 1.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

from nobubble.cli.preflight import ENV_UPDATE_S
from nobubble.cli.util import (
    check_budget,
    check_steps,
    nonneg_float,
    positive_int,
    print_json,
    print_table,
)
from nobubble.rl.actor_learner.config import ARCHS, LOSSES  # torch-free, as the flags need
from nobubble.validation import finite

__all__ = ["add_env_arguments", "check_producer_flags", "run_env"]

# the flags both producers read; every other flag belongs to one producer (argparse dests)
SHARED = ("task", "env", "max_staleness", "steps", "seed", "time_budget", "out", "json", "force")
_NOT_FLAGS = ("func", "producer_parser", "group_parser", "env_dests", "command", "rl_command")


def _target_return(text: str) -> float | str:
    """``--target-return``: a number, or ``"none"`` (never stop early)."""
    if text.lower() == "none":
        return "none"
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number or 'none'") from None
    if not finite(value):
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite number")
    return value


def add_env_arguments(parser: argparse.ArgumentParser, *, arch: bool = True) -> None:
    """The environment producer's flags (``arch``: one architecture is chosen, not all); their
    dests are recorded (``env_dests``) so that :func:`check_producer_flags` knows them."""
    g = parser.add_argument_group("environment producer (with --env; IMPALA, SEED RL, "
                                  "Sample Factory)")  # fmt: skip
    dests: list[str] = []

    def add(*flags: str, **kw: Any) -> None:
        dests.append(g.add_argument(*flags, **kw).dest)

    g.add_argument("--env", default=None, metavar="ID",
                   help="gymnasium id (CartPole-v1, Acrobot-v1) or a text env: guess-number, "
                   "rg:<task>; instead of --task")  # fmt: skip
    add(
        "--env-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a text env's option, repeatable: high=9, max_turns=4, a reasoning-gym config",
    )
    if arch:
        add("--arch", choices=ARCHS, default="seed",
            help="where inference runs: impala (in each actor), seed (central), sample-factory "
            "(central, double-buffered envs)")  # fmt: skip
    add("--actors", type=positive_int, default=None, help="actor processes (2)")
    add("--envs-per-actor", type=positive_int, default=None, metavar="N")
    add(
        "--env-step-delay-ms",
        type=nonneg_float,
        default=None,
        metavar="MS",
        help="sleep per env step, a stand-in for a slow simulator",
    )
    add(
        "--loss",
        choices=LOSSES,
        default=None,
        help="ppo (APPO, the default) or vtrace (IMPALA)",
    )
    add(
        "--env-steps",
        type=positive_int,
        default=None,
        metavar="N",
        help="stop after N environment steps",
    )
    add(
        "--target-return",
        type=_target_return,
        default=None,
        help="stop when the greedy eval mean reaches it ('none': never); default: the env's "
        "reward threshold (CartPole-v1 475, Acrobot-v1 -100; text envs: success 0.8)",
    )
    parser.set_defaults(env_dests=tuple(dests))


def check_producer_flags(args: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    """Refuse a flag that the chosen producer would ignore (ValueError naming both flags)."""
    env = args.env is not None
    if env and args.task is not None:
        raise ValueError("--task and --env pick two producers; give one of them")
    env_only = set(args.env_dests)
    task_only = set(vars(args)) - env_only - set(SHARED) - set(_NOT_FLAGS)
    other = sorted(task_only if env else env_only)
    given = [d for d in other if getattr(args, d) != parser.get_default(d)]
    if given:
        flag = "--" + given[0].replace("_", "-")
        chosen = f"--env {args.env}" if env else "--task"
        raise ValueError(f"{flag} is not read with {chosen}; drop {flag}")


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


_FLAGS = {
    "actors": "actors", "envs_per_actor": "envs_per_actor",
    "env_step_delay_ms": "env_step_delay_ms", "max_staleness": "max_staleness", "loss": "loss",
    "steps": "steps", "env_steps": "max_env_steps", "time_budget": "time_budget_s",
}  # fmt: skip


def env_config(args: argparse.Namespace, arch: str) -> Any:
    """The run's config (ValueError / ImportError on a bad value or a missing extra)."""
    from nobubble.rl.actor_learner.config import EnvRunConfig
    from nobubble.rl.actor_learner.text.run import is_text_env, text_env_config

    run: dict[str, Any] = {"arch": arch, "seed": args.seed}
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

    try:
        threshold = gymnasium.spec(env_id).reward_threshold
    except Exception as err:  # gymnasium's unknown-id errors are not ValueErrors
        raise ValueError(f"--env {env_id!r}: {err}") from None
    return None if threshold is None else float(threshold)


def _progress(version: int, metrics: dict[str, float]) -> None:
    if "eval_return" not in metrics:
        return  # a progress line per evaluation, not per update
    train = f"{metrics['train_return']:.3g}" if "train_return" in metrics else "-"
    print(f"  {metrics['wall_s']:6.1f}s  {metrics['env_steps']:>9,} steps  version {version}  "
          f"train return {train}  eval {metrics['eval_return']:.3g}", file=sys.stderr,
          flush=True)  # fmt: skip


def run_env(args: argparse.Namespace, *, compare: bool) -> int:
    """``rl train --env`` (one architecture) or ``rl compare --env`` (all three on the same
    budget); the exit status. Every config is built and the env checked before any actor
    starts; the flags and the config are checked before torch and gymnasium are imported."""
    actors, envs = args.actors or 2, args.envs_per_actor or 8
    # an env with its slot and trajectory buffers: ~50 kB (CartPole); a text env more
    check_budget("rl", processes=1 + actors, data_bytes=actors * envs * 50e3, force=args.force)
    first = env_config(args, ARCHS[0] if compare else args.arch)
    if first.steps is not None and args.time_budget is None:
        check_steps("rl", "--steps", first.steps, ENV_UPDATE_S, hint=", give --time-budget S",
                    force=args.force)  # fmt: skip
    configs = [dataclasses.replace(first, arch=a) for a in ARCHS] if compare else [first]
    from nobubble.rl.actor_learner.envs import env_label, env_spaces

    try:
        env_spaces(configs[0].env)  # an unknown id or unsupported spaces: a usage error
    except Exception as err:
        if type(err).__module__.startswith("gymnasium"):
            raise ValueError(f"--env {args.env!r}: {err}") from None
        raise
    from nobubble.rl import ActorFailure, train
    from nobubble.rl.system.report import plot_runs

    results = []
    for config in configs:
        print(f"training {config.arch} on {env_label(config.env)} ...", file=sys.stderr,
              flush=True)  # fmt: skip
        try:
            results.append(train(config, on_step=_progress))
        except ActorFailure as err:
            print(f"nobubble rl: {err}", file=sys.stderr)
            return 1
    stem = "compare" if compare else f"train_{configs[0].arch}"
    curves = {f"{r.arch} ({r.env_steps_per_s:,.0f} steps/s)": r for r in results}
    title = (f"{results[0].env}, the same budget: lines, the mean of the last 20 training "
             "episodes; dots, greedy evaluations")  # fmt: skip
    paths = {"plot": str(plot_runs(curves, Path(args.out) / f"{stem}.png", title=title))}
    if args.json:
        runs = {r.arch: {**r.to_json(), "artifacts": paths} for r in results}
        print_json({"runs": runs} if compare else runs[results[0].arch])
    elif compare:
        _compare_table(results)
    else:
        _table(results[0])
    if not args.json:
        print(f"plot: {paths['plot']}")
    return 0


def _compare_table(results: list[Any]) -> None:
    rows = [
        [r.arch, f"{r.eval_mean_return:.4g}",
         "-" if r.time_to_target_s is None else f"{r.time_to_target_s:.1f}",
         "-" if r.steps_to_target is None else f"{r.steps_to_target:,}",
         f"{r.env_steps_per_s:,.0f}", f"{r.idle_ratio.get('learner', 0.0):.0%}", r.staleness_max]
        for r in results
    ]  # fmt: skip
    first = results[0]
    print_table(
        f"{first.env}: {', '.join(ARCHS)} on the same budget (seed {first.config['seed']})",
        ["arch", "eval return", f"s to {first.target_return}", "steps to target", "env steps/s",
         "learner idle", "max staleness"],
        rows,
    )  # fmt: skip


def _table(r: Any) -> None:
    time_to = "-" if r.time_to_target_s is None else f"{r.time_to_target_s:.1f}s"
    lags = " ".join(f"{k}:{v}" for k, v in sorted(r.staleness_hist.items()))
    dropped = ", ".join(f"{k} {v}" for k, v in r.ledger.dropped.items() if v)
    rows = [
        ["eval mean return", f"{r.eval_mean_return:.4g} over {len(r.eval_returns)} episodes"],
        [f"time to {r.target_return}", time_to],
        ["env steps", f"{r.env_steps:,}"],
        ["env steps/s", f"{r.env_steps_per_s:,.0f}"],
        ["learner updates (policy version)", r.steps],
        ["idle ratio", ", ".join(f"{k} {v:.0%}" for k, v in r.idle_ratio.items())],
        ["staleness histogram (env steps)", lags or "-"],
        ["ledger", f"{r.ledger.trained} trained, dropped {dropped or 'none'}, ok: {r.ledger.ok}"],
    ]
    print_table(f"{r.arch} on {r.env} ({r.actors} x {r.envs_per_actor} envs)", ["", ""], rows)
