"""``nobubble ep``: expert-parallel commands (``bench``, ``balance``, ``train``)."""

from __future__ import annotations

import argparse
from typing import Any

from nobubble.cli import ep_balance, ep_train
from nobubble.cli.util import (
    ArgumentParser,
    UsageError,
    add_json_flag,
    check_budget,
    nonneg_int,
    plot_file,
    positive_float,
    positive_int,
    print_json,
    print_table,
)

__all__ = ["register"]


def register(parser: argparse.ArgumentParser) -> None:
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
    bench.add_argument("--ranks", type=positive_int, default=4, help="local ranks (default 4)")
    bench.add_argument("--tokens", type=positive_int, default=4096, help="tokens per rank")
    bench.add_argument("--hidden", type=positive_int, default=7168, help="hidden size")
    bench.add_argument("--experts", type=positive_int, default=256, help="routed experts")
    bench.add_argument("--topk", type=positive_int, default=8, help="experts per token")
    bench.add_argument("--dtype", choices=("bf16", "fp32"), default="bf16", help="payload dtype")
    bench.add_argument("--iters", type=positive_int, default=3, help="timed iterations (default 3)")
    bench.add_argument(
        "--warmup", type=nonneg_int, default=1, help="untimed iterations (default 1)"
    )
    bench.add_argument("--seed", type=nonneg_int, default=0, help="routing seed")
    bench.add_argument(
        "--transport",
        type=_transport_kinds,
        default=("auto",),
        help="how rows move between ranks, one kind or a comma list to compare: shm = shared "
        "memory on this host (Buffer's peer-write path: direct writes into the peers' "
        "/dev/shm slots); dist = torch.distributed (gloo) collectives; auto (default) = shm "
        "for gloo on one CPU host, else dist",
    )
    bench.add_argument(
        "--timeout", type=positive_float, default=1800.0, help="seconds before giving up"
    )
    bench.add_argument(
        "--force",
        action="store_true",
        help="run past the process, memory and --iters/--warmup budgets",
    )
    bench.add_argument("--plot", type=plot_file, help="also draw times and bytes (PNG or SVG)")
    add_json_flag(bench)
    bench.set_defaults(func=_bench)

    ep_balance.register(sub)
    ep_train.register(sub)


def _transport_kinds(text: str) -> tuple[str, ...]:
    kinds = tuple(k.strip() for k in text.split(",") if k.strip())
    bad = [k for k in kinds if k not in ("auto", "shm", "dist")]
    if not kinds or bad or len(set(kinds)) != len(kinds):
        raise argparse.ArgumentTypeError(
            f"{text!r}: give auto, shm or dist, or a comma list of distinct kinds (shm,dist)"
        )
    return kinds


MAX_ITERS = 1000
"""More timed iterations than this add nothing to a median and can run for hours."""


def _bench(args: argparse.Namespace) -> int:
    from nobubble.bench.ep_config import BenchConfig  # no torch: refusals come before it

    if args.ranks == 1:
        raise UsageError("--ranks 1: one rank dispatches to itself, nothing moves and there is "
                         "nothing to time; give --ranks 2 or more")  # fmt: skip
    for flag, count in (("--iters", args.iters), ("--warmup", args.warmup)):
        if count > MAX_ITERS and not args.force:
            raise UsageError(
                f"{flag} {count} is past the budget of {MAX_ITERS} (a median needs far "
                "fewer); lower it, or --force"
            )
    config = BenchConfig(
        num_ranks=args.ranks,
        num_tokens=args.tokens,
        hidden=args.hidden,
        num_experts=args.experts,
        topk=args.topk,
        dtype=args.dtype,
        num_iters=args.iters,
        num_warmup=args.warmup,
        timeout_s=args.timeout,
        seed=args.seed,
        transport=args.transport[0],
    )  # ValueError naming a bad combination, before the budget's estimate of it
    check_budget("ep bench", processes=args.ranks, data_bytes=config.data_bytes(),
                 force=args.force)  # fmt: skip
    if len(args.transport) > 1:
        if args.plot is not None:
            raise UsageError("--plot draws one transport; give --transport one kind with it")
        return _compare(config, args.transport, as_json=args.json)
    from nobubble.bench.ep_dispatch import run_with_progress
    from nobubble.bench.ep_tables import print_dispatch_report

    report = run_with_progress(config)
    if args.plot is not None:
        from nobubble.bench.ep_dispatch import plot_report

        plot_report(report.to_dict(), args.plot)
    if args.json:
        print_json(report.to_dict())
    else:
        print_dispatch_report(report)
    return 0 if all(m.correct for m in report.methods) else 1


def _compare(config: Any, kinds: tuple[str, ...], *, as_json: bool) -> int:
    """Run the benchmark once per transport kind and compare Buffer's times across them."""
    from dataclasses import replace

    from nobubble.bench.ep_dispatch import run_with_progress
    from nobubble.bench.ep_tables import print_dispatch_report

    reports = [run_with_progress(replace(config, transport=kind)) for kind in kinds]
    if as_json:
        print_json({"transports": [r.to_dict() for r in reports]})
    else:
        for report in reports:
            print_dispatch_report(report)
        first = reports[0].methods[0]
        print_table(
            "ep bench: Buffer over each transport (median, slowest rank)",
            ["transport", "dispatch ms", "combine ms", "dispatch vs first", "combine vs first"],
            [
                [
                    r.transport,
                    r.methods[0].dispatch_ms,
                    r.methods[0].combine_ms,
                    f"x{r.methods[0].dispatch_ms / first.dispatch_ms:.2f}",
                    f"x{r.methods[0].combine_ms / first.combine_ms:.2f}",
                ]
                for r in reports
            ],
        )
    return 0 if all(m.correct for r in reports for m in r.methods) else 1
