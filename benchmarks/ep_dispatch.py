"""Benchmark: DeepEP-style Buffer dispatch/combine vs per-pair all-to-all vs all-gather.

Runs ``nobubble ep bench``'s measurement (all three methods in the same processes), prints
the table and writes ``benchmarks/results/ep_dispatch.json`` and ``.png``.

    python -m benchmarks.ep_dispatch            # 4 ranks, 4096 x 7168 bf16, top-8 of 256
    python -m benchmarks.ep_dispatch --quick    # 4 ranks, 256 x 512, top-8 of 32
"""

from __future__ import annotations

import argparse
from pathlib import Path

from benchmarks._common import write_record
from benchmarks.records.ep_dispatch import EpDispatch
from nobubble.bench.ep_dispatch import BenchConfig, plot_report, run_with_progress
from nobubble.bench.ep_tables import print_dispatch_report

RESULTS = Path(__file__).resolve().parent / "results" / "ep_dispatch.json"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small shapes, a few seconds")
    parser.add_argument("--iters", type=int, default=3)
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument(
        "--transport",
        choices=("dist", "shm", "auto"),
        default="dist",
        help="row mover for every method (default dist: gloo's collectives, the README table)",
    )
    args = parser.parse_args()
    tokens, hidden, experts = (256, 512, 32) if args.quick else (4096, 7168, 256)
    config = BenchConfig(
        num_ranks=4,
        num_tokens=tokens,
        hidden=hidden,
        num_experts=experts,
        topk=8,
        num_iters=args.iters,
        transport=args.transport,
    )
    report = run_with_progress(config)
    print_dispatch_report(report)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    data = report.to_dict() | {"quick": args.quick}
    write_record(args.out, EpDispatch, data)
    png = plot_report(data, args.out.with_suffix(".png"))
    print(f"wrote {args.out} and {png}")
    if not all(m.correct for m in report.methods):
        raise SystemExit("a method produced wrong results")


if __name__ == "__main__":
    main()
