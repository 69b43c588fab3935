"""``nobubble trace``: merge per-rank trace files, summarise busy and idle time per rank."""

from __future__ import annotations

import argparse

from nobubble.bench.output import print_result
from nobubble.cli.util import ArgumentParser, add_json_flag, input_file, output_file
from nobubble.trace import merge_trace_files, summarize, write_chrome_trace


def register(parser: argparse.ArgumentParser) -> None:
    parser.set_defaults(group_parser=parser)
    sub = parser.add_subparsers(dest="trace_command", metavar="SUBCOMMAND",
                                parser_class=ArgumentParser)  # fmt: skip
    merge = sub.add_parser("merge", help="merge per-rank Chrome trace files into one")
    merge.add_argument("files", nargs="+", type=input_file,
                       help="Chrome trace JSON files (one per rank)")  # fmt: skip
    merge.add_argument("-o", "--output", type=output_file, required=True,
                       help="merged trace to write")  # fmt: skip
    summary = sub.add_parser("summary", help="busy / idle time per rank of a trace file")
    summary.add_argument("files", nargs="+", type=input_file, help="Chrome trace JSON files")
    for p in (merge, summary):
        add_json_flag(p)
        p.set_defaults(func=_trace)


def _trace(args: argparse.Namespace) -> int:
    """``merge`` (the merged trace written to ``--output``) or ``summary``: per-rank busy and
    idle time of the files' events, a table or JSON (with ``output`` first, for ``merge``)."""
    events, names = merge_trace_files(args.files)
    title, extra = f"{len(events)} events", {}
    if args.trace_command == "merge":
        write_chrome_trace(args.output, events, rank_names=names)
        title = f"merged {len(args.files)} files, {len(events)} events -> {args.output}"
        extra = {"output": str(args.output)}
    ranks = [{"rank": s.rank, "events": s.num_events, "span_ms": s.span_us / 1e3,
              "busy_ms": s.busy_us / 1e3, "idle_ratio": s.idle_ratio}
             for s in summarize(events)]  # fmt: skip
    print_result(args.json, extra | {"num_events": len(events), "ranks": ranks}, title,
                 ["rank", "events", "span ms", "busy ms", "idle"],
                 [[r["rank"], r["events"], r["span_ms"], r["busy_ms"], f"{r['idle_ratio']:.1%}"]
                  for r in ranks])  # fmt: skip
    return 0
