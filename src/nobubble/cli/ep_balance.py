"""``nobubble ep balance``: place redundant experts for given or synthetic loads.

Flags -> loads (:mod:`nobubble.moe.balance.loads`) -> :func:`~nobubble.moe.balance.report.
balance_report` -> a table or JSON. Prints the load of every GPU before (each expert once, in order, no redundancy) and after
:func:`~nobubble.moe.balance.eplb.rebalance_experts`, the imbalance (max / mean GPU load) of both,
DeepSeek's original EPLB on the same loads for comparison, and the placement. ``--plot``
draws the before / after loads.
"""

from __future__ import annotations

import argparse

from nobubble.cli.flags import add_run_flags
from nobubble.cli.util import (
    UsageError,
    input_file,
    nonneg_int,
    positive_int,
    print_json,
    print_table,
)
from nobubble.validation import MAX_REAL, finite

__all__ = ["register"]

SUMMARY = (
    ("imbalance_before", "max/mean before"),
    ("imbalance", "max/mean after"),
    ("duplicate_gpus", "GPUs with an expert twice"),
    ("eplb_original_imbalance", "EPLB original max/mean"),
    ("eplb_original_duplicate_gpus", "EPLB: GPUs with an expert twice"),
)
"""The per-layer summary table: (report key, column), one per figure of every layer."""


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``balance`` to the ``ep`` group's sub-command parsers ``sub``."""
    p = sub.add_parser(
        "balance",
        help="place redundant experts (EPLB) and show per-GPU load before / after",
        description=__doc__.splitlines()[0] if __doc__ else None,
    )
    p.add_argument("--experts", type=positive_int, required=True, help="logical experts E")
    p.add_argument("--gpus", type=positive_int, required=True, help="GPUs G (multiple of --nodes)")
    p.add_argument("--nodes", type=positive_int, default=1, help="nodes N (default 1)")
    p.add_argument(
        "--redundant", type=nonneg_int, default=0, help="redundant experts: E + R must divide by G"
    )
    p.add_argument("--groups", type=positive_int, default=1, help="expert groups (default 1)")
    p.add_argument(
        "--policy", choices=("auto", "hierarchical", "global"), default="auto", help="EPLB policy"
    )
    src = p.add_mutually_exclusive_group()
    src.add_argument(
        "--skew",
        default="zipf:1.0",
        help="synthetic loads: zipf:S (load ~ 1/rank^S) or pareto:A (Pareto tail index A)",
    )
    src.add_argument(
        "--weights",
        type=input_file,
        help="loads file: JSON list (or list of lists, one per layer) "
        "or text with one whitespace/comma separated row per layer",
    )
    p.add_argument("--layers", type=positive_int, default=1, help="synthetic layers (default 1)")
    p.add_argument("--tokens", type=positive_int, default=100_000, help="synthetic tokens/layer")
    p.add_argument("--seed", type=nonneg_int, default=0, help="seed for synthetic loads")
    add_run_flags(p, plot="draw per-GPU loads before / after (PNG or SVG)",
                  force="place more layer x expert slots than the budget")  # fmt: skip
    p.set_defaults(func=_balance, parser=p)


def _check_problem(args: argparse.Namespace) -> None:
    """Refuse, before any loads are made (and torch is imported), a placement EPLB cannot
    do and a skew it cannot draw (the library's ValueErrors), a flag the chosen load source
    ignores, and a problem past :data:`MAX_SLOTS`."""
    from nobubble.moe.balance.problem import MAX_SLOTS, check_config, parse_skew  # no torch

    check_config(args.experts, args.experts + args.redundant, args.groups, args.nodes,
                 args.gpus, args.policy)  # fmt: skip
    if args.weights is not None:
        for flag in ("layers", "tokens", "seed"):
            if getattr(args, flag) != args.parser.get_default(flag):
                raise UsageError(f"--{flag} shapes synthetic loads; --weights gives the loads, "
                                 f"drop --{flag}")  # fmt: skip
        return
    parse_skew(args.skew)
    if not finite(args.tokens):
        raise UsageError(f"--tokens {args.tokens}: past {MAX_REAL:g}, not a count of tokens")
    slots = args.layers * (args.experts + args.redundant)
    if slots > MAX_SLOTS and not args.force:
        raise UsageError(
            f"ep balance: --layers {args.layers:,} x {args.experts + args.redundant:,} physical "
            f"experts = {slots:,} placements, past the budget of {MAX_SLOTS:,}; use fewer, or "
            "--force"
        )


def _balance(args: argparse.Namespace) -> int:
    _check_problem(args)  # before torch is imported (by the two modules below)
    from nobubble.moe.balance.loads import expert_loads
    from nobubble.moe.balance.report import balance_report, plot_balance

    weight = expert_loads(args.experts, path=args.weights, skew=args.skew,
                          num_layers=args.layers, tokens=args.tokens, seed=args.seed)  # fmt: skip
    result = balance_report(weight, num_redundant=args.redundant, num_groups=args.groups,
                            num_nodes=args.nodes, num_gpus=args.gpus, policy=args.policy)  # fmt: skip
    report = result.to_dict()
    if args.plot is not None:
        report["plot"] = str(plot_balance(result, args.plot))
    if args.json:
        print_json(report)
    else:
        _print(report)
    return 0


def _print(report: dict) -> None:
    gpn, counts = report["gpus"] // report["nodes"], report["logcnt"][0]
    rows = [[g, g // gpn, report["gpu_load_before"][0][g], report["gpu_load_after"][0][g],
             " ".join(f"{e}" + ("*" if counts[e] > 1 else "") for e in experts)]
            for g, experts in enumerate(report["gpu_experts"][0])]  # fmt: skip
    print_table(
        f"layer 0: {report['experts']} experts + {report['redundant']} redundant on "
        f"{report['gpus']} GPUs / {report['nodes']} nodes ({report['policy']})",
        ["gpu", "node", "load before", "load after", "experts (* = replicated)"],
        rows,
    )
    per_layer = zip(*(report[key] for key, _ in SUMMARY))  # (layer's figure of each key)
    print_table("imbalance (max / mean GPU load)", ["layer", *(c for _, c in SUMMARY)],
                [[layer, *figures] for layer, figures in enumerate(per_layer)])  # fmt: skip
