"""``nobubble ep``: expert-parallel commands (``bench`` here, ``balance``, ``train``).

Every command: flags -> a library config (:class:`~nobubble.bench.ep_config.BenchConfig`,
:class:`~nobubble.bench.ep_config.TrainConfig`) -> one library call -> a table or JSON. A
config's flags are declared once, as a table (:mod:`nobubble.cli.flags`): a flag left out
keeps the config's own default, and the config's ValueError is the one-line error (exit 2).
This module and the configs import no torch, so a bad flag is refused at once.
"""

from __future__ import annotations

import argparse

from nobubble.bench.ep_config import DTYPE_NAMES
from nobubble.cli import ep_balance, ep_train
from nobubble.cli.flags import Flag, add_config_flags, add_run_flags, config_from_flags
from nobubble.cli.util import (
    ArgumentParser,
    UsageError,
    check_budget,
    nonneg_int,
    positive_float,
    positive_int,
    print_json,
)
from nobubble.moe.layout import TRANSPORT_KINDS

__all__ = ["register"]

BENCH_FLAGS: tuple[Flag, ...] = (
    ("--ranks", "num_ranks", positive_int, "local ranks"),
    ("--tokens", "num_tokens", positive_int, "tokens per rank"),
    ("--hidden", "hidden", positive_int, "hidden size"),
    ("--experts", "num_experts", positive_int, "routed experts"),
    ("--topk", "topk", positive_int, "experts per token"),
    ("--dtype", "dtype", DTYPE_NAMES, "payload dtype"),
    ("--iters", "num_iters", positive_int, "timed iterations"),
    ("--warmup", "num_warmup", nonneg_int, "untimed iterations"),
    ("--seed", "seed", nonneg_int, "routing seed"),
    ("--timeout", "timeout_s", positive_float, "seconds before giving up"),
)

MAX_ITERS = 1000
"""More timed iterations than this add nothing to a median and can run for hours."""


def register(parser: argparse.ArgumentParser) -> None:
    from nobubble.bench.ep_config import BenchConfig

    parser.set_defaults(group_parser=parser)
    sub = parser.add_subparsers(
        dest="ep_command", metavar="SUBCOMMAND", parser_class=ArgumentParser
    )
    bench = sub.add_parser(
        "bench",
        help="time Buffer dispatch/combine against per-pair all-to-all and all-gather",
        description="Spawn R local ranks (gloo, one thread each) and time DeepEP-style "
        "dispatch/combine beside two baselines in the same processes, all three over one "
        "transport (--transport); several transports (--transport shm,dist) run one after "
        "the other and are compared through the same Buffer.",
    )
    add_config_flags(bench, BenchConfig, BENCH_FLAGS)
    bench.add_argument(
        "--transport",
        type=_transport_kinds,
        default=("auto",),
        help="how rows move between ranks, one kind or a comma list to compare: shm = shared "
        "memory on this host (Buffer's peer-write path: direct writes into the peers' "
        "/dev/shm slots); dist = torch.distributed (gloo) collectives; auto (default) = shm "
        "for gloo on one CPU host, else dist",
    )
    add_run_flags(bench, plot="also draw times and bytes (PNG or SVG)",
                  force="run past the process, memory and --iters/--warmup budgets")  # fmt: skip
    bench.set_defaults(func=_bench)
    ep_balance.register(sub)
    ep_train.register(sub)


def _transport_kinds(text: str) -> tuple[str, ...]:
    kinds = tuple(k.strip() for k in text.split(",") if k.strip())
    if not kinds or set(kinds) - set(TRANSPORT_KINDS) or len(set(kinds)) != len(kinds):
        raise argparse.ArgumentTypeError(
            f"{text!r}: give auto, shm or dist, or a comma list of distinct kinds (shm,dist)"
        )
    return kinds


def _bench(args: argparse.Namespace) -> int:
    from nobubble.bench.ep_config import BenchConfig  # no torch: refusals come before it

    config = config_from_flags(BenchConfig, BENCH_FLAGS, args, transport=args.transport[0])
    if config.num_ranks == 1:
        raise UsageError("--ranks 1: one rank dispatches to itself, nothing moves and there is "
                         "nothing to time; give --ranks 2 or more")  # fmt: skip
    for flag, count in (("--iters", config.num_iters), ("--warmup", config.num_warmup)):
        if count > MAX_ITERS and not args.force:
            raise UsageError(f"{flag} {count} is past the budget of {MAX_ITERS} (a median "
                             "needs far fewer); lower it, or --force")  # fmt: skip
    check_budget("ep bench", processes=config.num_ranks, data_bytes=config.data_bytes(),
                 force=args.force)  # fmt: skip
    if len(args.transport) > 1 and args.plot is not None:
        raise UsageError("--plot draws one transport; give --transport one kind with it")
    from nobubble.bench.ep_dispatch import plot_report, run_transports
    from nobubble.bench.ep_tables import print_dispatch_report, print_transport_comparison

    reports = run_transports(config, args.transport)
    if args.plot is not None:
        plot_report(reports[0].to_dict(), args.plot)
    if args.json:
        dicts = [r.to_dict() for r in reports]
        print_json(dicts[0] if len(dicts) == 1 else {"transports": dicts})
    else:
        for report in reports:
            print_dispatch_report(report)
        if len(reports) > 1:
            print_transport_comparison(reports)
    return 0 if all(m.correct for r in reports for m in r.methods) else 1
