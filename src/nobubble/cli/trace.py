"""``nobubble trace``: merge per-rank trace files, summarise busy and idle time per rank."""

from __future__ import annotations

import argparse

from nobubble.cli.util import (
    ArgumentParser,
    add_json_flag,
    input_file,
    output_file,
    print_json,
    print_table,
)
from nobubble.trace import merge_trace_files, summarize, write_chrome_trace


def register(parser: argparse.ArgumentParser) -> None:
    parser.set_defaults(group_parser=parser)
    sub = parser.add_subparsers(
        dest="trace_command", metavar="SUBCOMMAND", parser_class=ArgumentParser
    )

    merge = sub.add_parser("merge", help="merge per-rank Chrome trace files into one")
    merge.add_argument("files", nargs="+", type=input_file,
                       help="Chrome trace JSON files (one per rank)")  # fmt: skip
    merge.add_argument(
        "-o", "--output", type=output_file, required=True, help="merged trace to write"
    )
    add_json_flag(merge)
    merge.set_defaults(func=_merge)

    summary = sub.add_parser("summary", help="busy / idle time per rank of a trace file")
    summary.add_argument("files", nargs="+", type=input_file, help="Chrome trace JSON files")
    add_json_flag(summary)
    summary.set_defaults(func=_summary)


def _rows(events):
    return [
        {
            "rank": s.rank,
            "events": s.num_events,
            "span_ms": s.span_us / 1e3,
            "busy_ms": s.busy_us / 1e3,
            "idle_ratio": s.idle_ratio,
        }
        for s in summarize(events)
    ]


def _print(rows, title: str) -> None:
    print_table(
        title,
        ["rank", "events", "span ms", "busy ms", "idle"],
        [
            [r["rank"], r["events"], r["span_ms"], r["busy_ms"], f"{r['idle_ratio']:.1%}"]
            for r in rows
        ],
    )


def _merge(args: argparse.Namespace) -> int:
    events, names = merge_trace_files(args.files)
    write_chrome_trace(args.output, events, rank_names=names)
    rows = _rows(events)
    if args.json:
        print_json({"output": str(args.output), "num_events": len(events), "ranks": rows})
    else:
        _print(rows, f"merged {len(args.files)} files, {len(events)} events -> {args.output}")
    return 0


def _summary(args: argparse.Namespace) -> int:
    events, _ = merge_trace_files(args.files)
    rows = _rows(events)
    if args.json:
        print_json({"num_events": len(events), "ranks": rows})
    else:
        _print(rows, f"{len(events)} events")
    return 0
