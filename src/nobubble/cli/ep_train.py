"""``nobubble ep train``: train a small MoE-GPT with data x expert parallelism, for real.

Spawns R local gloo ranks (a dp x ep grid), trains the model on the standard library's
docstrings and prints, per step, the loss and the load imbalance (max / mean rows per rank
and per physical expert); ``--redundant`` adds replicas of hot experts, ``--rebalance-every``
re-places them online (EPLB) from the last steps' loads, ``--check-dense`` trains the same
model dense in one process and compares the losses. Draws loss and imbalance (``--plot``).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from nobubble.cli.util import (
    UsageError,
    add_json_flag,
    check_budget,
    check_steps,
    console,
    nonneg_int,
    plot_file,
    positive_float,
    positive_int,
    print_json,
    print_table,
    run_with_progress_bar,
)
from nobubble.files import claim_output

__all__ = ["register"]

MAX_ROWS = 30
"""Longer runs print this many evenly spaced steps (the JSON has all of them)."""


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``train`` to the ``ep`` group's sub-command parsers ``sub``."""
    p = sub.add_parser(
        "train",
        help="train a small MoE-GPT with expert parallelism; loss and load imbalance per step",
        description=__doc__.splitlines()[0] if __doc__ else None,
    )
    p.add_argument("--ranks", type=positive_int, default=4, help="local ranks R (default 4)")
    p.add_argument("--steps", type=positive_int, default=20, help="training steps (default 20)")
    p.add_argument(
        "--ep",
        type=positive_int,
        default=None,
        help="expert-parallel ranks per group, dp = R / ep (default: gcd(R, --experts))",
    )
    p.add_argument("--experts", type=positive_int, default=8, help="routed experts per layer")
    p.add_argument("--topk", type=positive_int, default=2, help="experts per token (default 2)")
    p.add_argument(
        "--redundant",
        type=nonneg_int,
        default=0,
        help="extra physical experts per layer (replicas of hot ones), a multiple of ep",
    )
    p.add_argument(
        "--rebalance-every",
        type=positive_int,
        default=None,
        metavar="K",
        help="online EPLB every K steps: re-place replicas, move weights and Adam state",
    )
    p.add_argument(
        "--check-dense",
        action="store_true",
        help="also train the dense model in one process on all ranks' batches; compare losses",
    )
    p.add_argument("--batch", type=positive_int, default=8, help="sequences per rank and step")
    p.add_argument("--lr", type=positive_float, default=3e-3, help="AdamW learning rate")
    p.add_argument("--seed", type=nonneg_int, default=0, help="model and data seed")
    p.add_argument("--timeout", type=positive_float, default=600.0, help="seconds before giving up")
    p.add_argument(
        "--plot",
        type=plot_file,
        default=Path("nobubble-out/ep_train.png"),
        help="loss and imbalance against step (PNG or SVG; default nobubble-out/ep_train.png)",
    )
    p.add_argument(
        "--force", action="store_true", help="run past the process, memory and --steps budgets"
    )
    add_json_flag(p)
    p.set_defaults(func=_train)


def _config(args: argparse.Namespace) -> Any:
    from nobubble.bench.ep_config import TrainConfig  # no torch: refusals come before it

    return TrainConfig(
        num_ranks=args.ranks,
        ep=args.ep or 0,
        num_steps=args.steps,
        num_experts=args.experts,
        topk=args.topk,
        num_redundant=args.redundant,
        rebalance_every=args.rebalance_every or 0,
        batch_size=args.batch,
        lr=args.lr,
        seed=args.seed,
        check_dense=args.check_dense,
        timeout_s=args.timeout,
    )


def _check_run(args: argparse.Namespace, config: Any) -> None:
    """Refuse, before any rank starts: the processes, the memory (``config.data_bytes()``),
    steps that cannot end within ``--timeout`` (the whole job's limit), and an online EPLB with one
    expert-parallel rank (every expert lives on it: nothing can move)."""
    from nobubble.bench.ep_config import STEP_S

    check_budget("ep train", processes=args.ranks, data_bytes=config.data_bytes(),
                 force=args.force)  # fmt: skip
    check_steps("ep train", "--steps", args.steps, STEP_S, limit_s=args.timeout,
                limit=f"--timeout {args.timeout:g} s, the whole run's limit",
                hint=", raise --timeout", force=args.force)  # fmt: skip
    if args.rebalance_every and config.expert_parallel == 1:
        raise UsageError(f"--rebalance-every {args.rebalance_every} with ep 1: every expert is "
                         "on every rank and no placement differs; give --ep 2 or more, or drop "
                         "--rebalance-every")  # fmt: skip


def _train(args: argparse.Namespace) -> int:
    config = _config(args)  # ValueError naming the value: exit 2, before any work
    _check_run(args, config)
    from nobubble.bench.ep_train import plot_report

    with claim_output(args.plot):  # before the ranks start: refuse another live run's plot
        report = _run_with_progress(config, quiet=args.json)
        plot = plot_report(report, args.plot)
    if args.json:
        print_json({**report.to_dict(), "plot": str(plot)})
    else:
        _print(report, plot)
    return 1 if report.dense_ok is False else 0


def _run_with_progress(config: Any, *, quiet: bool) -> Any:
    """Train while a progress bar on stderr follows rank 0's steps (then the dense run's)."""
    from nobubble.bench.ep_train import run_training

    return run_with_progress_bar(
        lambda updates: run_training(config, progress=updates),
        label=f"starting {config.num_ranks} ranks",
        total=config.num_steps,
        counter="step {task.completed}/{task.total}",
        info=lambda extra: f"loss {extra[0]:.4f}",
        quiet=quiet,
    )


def _print(report: Any, plot: Path) -> None:
    c, n = report.config, len(report.losses)
    shown = (
        sorted({round(i * (n - 1) / (MAX_ROWS - 1)) for i in range(MAX_ROWS)})
        if n > MAX_ROWS
        else range(n)
    )
    dense = report.dense_losses is not None
    columns = ["step", "loss", *(["dense loss", "|diff|"] if dense else []),
               "max/mean rank load", "max/mean expert load"]  # fmt: skip
    rows = []
    for s in shown:
        check = [report.dense_losses[s], report.dense_abs_diff[s]] if dense else []
        rows.append([s + 1, report.losses[s], *check, report.rank_imbalance[s],
                     report.expert_imbalance[s]])  # fmt: skip
    print_table(
        f"ep train: {c.num_ranks} ranks (dp {report.dp} x ep {report.ep}), {c.num_experts} "
        f"experts + {c.num_redundant} redundant, top-{c.topk}, "
        + (f"rebalance every {c.rebalance_every} steps" if c.rebalance_every else "no rebalancing"),
        columns,
        rows,
        caption="load: (token, slot) rows received, max / mean over ranks and over physical "
        "experts, mean over MoE layers",
    )
    out = console()
    out.print(
        f"loss {report.losses[0]:.4f} -> {report.final_loss:.4f} in {n} steps "
        f"({report.seconds:.1f} s); max/mean rank load over the second half "
        f"{report.rank_imbalance_second_half:.4f}"
    )
    if dense:
        verdict = "equal" if report.dense_ok else "DIFFERENT"
        out.print(
            f"dense single process: loss {report.dense_losses[-1]:.4f} at the last step; "
            f"|diff| {report.dense_abs_diff[-1]:.2e} last, {max(report.dense_abs_diff):.2e} max "
            f"({verdict} within 1e-4)"
        )
    if report.rebalances:
        moved = sum(r["moved"] for r in report.rebalances)
        out.print(f"{len(report.rebalances)} layer rebalances moved {moved} experts")
    out.print(f"plot: {plot}")
