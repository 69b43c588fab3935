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

from nobubble.cli.flags import Flag, add_config_flags, add_run_flags, config_from_flags
from nobubble.cli.util import (
    check_budget,
    check_steps,
    console,
    nonneg_int,
    positive_float,
    positive_int,
    print_json,
    print_table,
)
from nobubble.files import claim_output

__all__ = ["register"]

MAX_ROWS = 30
"""Longer runs print this many evenly spaced steps (the JSON has all of them)."""

TRAIN_FLAGS: tuple[Flag, ...] = (
    ("--ranks", "num_ranks", positive_int, "local ranks R"),
    ("--steps", "num_steps", positive_int, "training steps"),
    ("--ep", "ep", positive_int,
     "expert-parallel ranks per group, dp = R / ep (default: gcd(R, --experts))"),
    ("--experts", "num_experts", positive_int, "routed experts per layer"),
    ("--topk", "topk", positive_int, "experts per token"),
    ("--redundant", "num_redundant", nonneg_int,
     "extra physical experts per layer (replicas of hot ones), a multiple of ep"),
    ("--rebalance-every", "rebalance_every", positive_int,
     "online EPLB every K steps: re-place replicas, move weights and Adam state (default: never)"),
    ("--check-dense", "check_dense", bool,
     "also train the dense model in one process on all ranks' batches; compare losses"),
    ("--batch", "batch_size", positive_int, "sequences per rank and step"),
    ("--lr", "lr", positive_float, "AdamW learning rate"),
    ("--seed", "seed", nonneg_int, "model and data seed"),
    ("--timeout", "timeout_s", positive_float, "seconds before giving up"),
)  # fmt: skip


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``train`` to the ``ep`` group's sub-command parsers ``sub``."""
    from nobubble.bench.ep_config import TrainConfig

    p = sub.add_parser(
        "train",
        help="train a small MoE-GPT with expert parallelism; loss and load imbalance per step",
        description=__doc__.splitlines()[0] if __doc__ else None,
    )
    add_config_flags(p, TrainConfig, TRAIN_FLAGS)
    add_run_flags(p, plot_default=Path("nobubble-out/ep_train.png"),
                  plot="loss and imbalance against step (PNG or SVG; default "
                  "nobubble-out/ep_train.png)",
                  force="run past the process, memory and --steps budgets")  # fmt: skip
    p.set_defaults(func=_train)


def _train(args: argparse.Namespace) -> int:
    from nobubble.bench.ep_config import STEP_S, TrainConfig  # no torch: refusals before it

    config = config_from_flags(TrainConfig, TRAIN_FLAGS, args)  # ValueError: exit 2
    check_budget("ep train", processes=config.num_ranks, data_bytes=config.data_bytes(),
                 force=args.force)  # fmt: skip
    check_steps("ep train", "--steps", config.num_steps, STEP_S, limit_s=config.timeout_s,
                limit=f"--timeout {config.timeout_s:g} s, the whole run's limit",
                hint=", raise --timeout", force=args.force)  # fmt: skip
    from nobubble.bench.ep_train import plot_report, run_with_progress

    with claim_output(args.plot):  # before the ranks start: refuse another live run's plot
        report = run_with_progress(config, quiet=args.json)
        plot = plot_report(report, args.plot)
    if args.json:
        print_json({**report.to_dict(), "plot": str(plot)})
    else:
        _print(report, plot)
    return 1 if report.dense_ok is False else 0


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
