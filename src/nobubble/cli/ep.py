"""``nobubble ep``: ``bench``, ``balance`` and ``train``, each flags -> a library config or
call -> a table or JSON. It imports no torch, so a bad flag is refused before torch loads."""

from __future__ import annotations

import argparse
from pathlib import Path

from nobubble.bench.ep_config import BenchConfig, TrainConfig
from nobubble.bench.output import print_json
from nobubble.cli.flags import (
    add_args,
    add_config_flags,
    add_run_flags,
    config_flags,
    config_from_flags,
)
from nobubble.cli.util import ArgumentParser, UsageError, input_file, nonneg_int, positive_int
from nobubble.files import claim_output
from nobubble.moe.layout import TRANSPORT_KINDS

__all__ = ["register"]

BENCH_FLAGS = config_flags(
    BenchConfig,
    "--ranks=num_ranks --tokens=num_tokens hidden --experts=num_experts topk dtype "
    "--iters=num_iters --warmup=num_warmup seed --timeout=timeout_s",
)

BALANCE_FLAGS: tuple[tuple, ...] = (
    ("--experts", positive_int, None, "logical experts E", {"required": True}),
    ("--gpus", positive_int, None, "GPUs G (multiple of --nodes)", {"required": True}),
    ("--nodes", positive_int, 1, "nodes N (default 1)"),
    ("--redundant", nonneg_int, 0, "redundant experts: E + R must divide by G"),
    ("--groups", positive_int, 1, "expert groups (default 1)"),
    ("--policy", ("auto", "hierarchical", "global"), "auto", "EPLB policy"),
    ("--layers", positive_int, 1, "synthetic layers (default 1)"),
    ("--tokens", positive_int, 100_000, "synthetic tokens/layer"),
    ("--seed", nonneg_int, 0, "seed for synthetic loads"),
)
"""``ep balance``'s flags, :func:`~nobubble.cli.flags.add_args` rows."""

TRAIN_FLAGS = config_flags(
    TrainConfig,
    "--ranks=num_ranks --steps=num_steps ep --experts=num_experts topk "
    "--redundant=num_redundant rebalance_every check_dense --batch=batch_size lr seed "
    "--timeout=timeout_s",
    ep=positive_int,  # 0 (gcd) and never are what leaving them out gives
    rebalance_every=positive_int,
)


def register(parser: argparse.ArgumentParser) -> None:
    parser.set_defaults(group_parser=parser)
    sub = parser.add_subparsers(dest="ep_command", metavar="SUBCOMMAND",
                                parser_class=ArgumentParser)  # fmt: skip
    bench = sub.add_parser(
        "bench",
        help="time Buffer dispatch/combine against per-pair all-to-all and all-gather",
        description="Spawn R local gloo ranks and time DeepEP-style dispatch/combine beside two "
        "baselines, over each --transport in turn.",
    )
    add_config_flags(bench, BenchConfig, BENCH_FLAGS)
    bench.add_argument(
        "--transport",
        type=_transport_kinds,
        default=("auto",),
        help="how rows move, a kind or a comma list to compare: shm (writes into the peers' "
        "/dev/shm slots), dist (gloo collectives), auto (default: shm for gloo on one host, "
        "else dist)",
    )
    add_run_flags(bench, plot="also draw times and bytes (PNG or SVG)",
                  force="run past the process, memory and --iters/--warmup budgets")  # fmt: skip
    bench.set_defaults(func=_bench)

    balance = sub.add_parser(
        "balance",
        help="place redundant experts (EPLB) and show per-GPU load before / after",
        description="Place redundant experts for given or synthetic loads: every GPU's load and "
        "the imbalance before and after EPLB, beside DeepSeek's original EPLB.",
    )
    add_args(balance, BALANCE_FLAGS)
    src = balance.add_mutually_exclusive_group()
    src.add_argument("--skew", default="zipf:1.0", help="synthetic loads: zipf:S (load ~ "
                     "1/rank^S) or pareto:A (Pareto tail index A)")  # fmt: skip
    src.add_argument("--weights", type=input_file, help="loads file: JSON list (or list of "
                     "lists, one per layer) or text with one whitespace/comma separated row "
                     "per layer")  # fmt: skip
    add_run_flags(balance, plot="draw per-GPU loads before / after (PNG or SVG)",
                  force="place more layer x expert slots than the budget")  # fmt: skip
    balance.set_defaults(func=_balance, parser=balance)

    train = sub.add_parser(
        "train",
        help="train a small MoE-GPT with expert parallelism; loss and load imbalance per step",
        description="Train a small MoE-GPT with data x expert parallelism on R local gloo "
        "ranks, for real: loss and load imbalance per step.",
    )
    add_config_flags(train, TrainConfig, TRAIN_FLAGS)
    add_run_flags(train, plot_default=Path("nobubble-out/ep_train.png"),
                  plot="loss and imbalance against step (PNG or SVG; default "
                  "nobubble-out/ep_train.png)",
                  force="run past the process, memory and --steps budgets")  # fmt: skip
    train.set_defaults(func=_train)


def _transport_kinds(text: str) -> tuple[str, ...]:
    kinds = tuple(k.strip() for k in text.split(",") if k.strip())
    if not kinds or set(kinds) - set(TRANSPORT_KINDS) or len(set(kinds)) != len(kinds):
        raise argparse.ArgumentTypeError(
            f"{text!r}: give auto, shm or dist, or a comma list of distinct kinds (shm,dist)"
        )
    return kinds


def _bench(args: argparse.Namespace) -> int:
    config = config_from_flags(BenchConfig, BENCH_FLAGS, args, transport=args.transport[0])
    if config.num_ranks == 1:
        raise UsageError("--ranks 1: one rank dispatches to itself, nothing moves and there is "
                         "nothing to time; give --ranks 2 or more")  # fmt: skip
    config.check_budget(force=args.force)
    if len(args.transport) > 1 and args.plot is not None:
        raise UsageError("--plot draws one transport; give --transport one kind with it")
    from nobubble.bench.ep_dispatch import plot_report, run_transports
    from nobubble.bench.ep_tables import print_bench_reports

    reports = run_transports(config, args.transport)
    if args.plot is not None:
        plot_report(reports[0].to_dict(), args.plot)
    if args.json:
        dicts = [r.to_dict() for r in reports]
        print_json(dicts[0] if len(dicts) == 1 else {"transports": dicts})
    else:
        print_bench_reports(reports)
    return 0 if all(m.correct for r in reports for m in r.methods) else 1


def _check_balance(args: argparse.Namespace) -> None:
    """Refuse, before torch is imported, a placement EPLB cannot do, a flag the chosen load
    source ignores and synthetic loads the library cannot draw (the library's ValueErrors)."""
    from nobubble.moe.balance.problem import check_config, check_synthetic  # no torch

    check_config(args.experts, args.experts + args.redundant, args.groups, args.nodes,
                 args.gpus, args.policy)  # fmt: skip
    if args.weights is not None:
        for flag in ("layers", "tokens", "seed"):
            if getattr(args, flag) != args.parser.get_default(flag):
                raise UsageError(f"--{flag} shapes synthetic loads; --weights gives the loads, "
                                 f"drop --{flag}")  # fmt: skip
        return
    check_synthetic(args.experts, args.redundant, args.layers, args.tokens, args.skew,
                    force=args.force)  # fmt: skip


def _balance(args: argparse.Namespace) -> int:
    _check_balance(args)  # before torch is imported (by the two modules below)
    from nobubble.bench.ep_tables import print_balance_report
    from nobubble.moe.balance.loads import expert_loads
    from nobubble.moe.balance.report import balance_report, plot_balance

    weight = expert_loads(args.experts, path=args.weights, skew=args.skew,
                          num_layers=args.layers, tokens=args.tokens, seed=args.seed)  # fmt: skip
    result = balance_report(weight, num_redundant=args.redundant, num_groups=args.groups,
                            num_nodes=args.nodes, num_gpus=args.gpus, policy=args.policy)  # fmt: skip
    r = result.to_dict()
    if args.plot is not None:
        r["plot"] = str(plot_balance(result, args.plot))
    if args.json:
        print_json(r)
    else:
        print_balance_report(r)
    return 0


def _train(args: argparse.Namespace) -> int:
    config = config_from_flags(TrainConfig, TRAIN_FLAGS, args)  # ValueError: exit 2
    config.check_budget(force=args.force)
    from nobubble.bench.ep_tables import print_train_report
    from nobubble.bench.ep_train import plot_report, run_with_progress

    with claim_output(args.plot):  # before the ranks start: refuse another live run's plot
        report = run_with_progress(config, quiet=args.json)
        plot = plot_report(report, args.plot)
    if args.json:
        print_json({**report.to_dict(), "plot": str(plot)})
    else:
        print_train_report(report, plot)
    return 1 if report.dense_ok is False else 0
