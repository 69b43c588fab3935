"""Expert-parallel fast paths on CPU: shared memory vs gloo, hierarchical, low-latency, FP8, overlap.

Every section spawns real local ranks (gloo) and runs its baseline in the same processes
(the measuring code is ``nobubble.bench.ep_fastpath``, shared with ``nobubble demo``):

- ``transports``: Buffer dispatch + combine, 4 ranks, 4096 x 7168 bf16 tokens, top-8 of 256
  experts, with gloo's all-to-all and with the shared-memory paths; bandwidth as a fraction
  of one core's memcpy bandwidth, measured in the same run.
- ``hierarchical``: 2 "nodes" x 2 ranks, 1024 tokens per rank; bytes that cross node
  boundaries, hierarchical vs flat.
- ``low_latency``: 128 tokens per rank, low-latency dispatch + combine vs normal mode, bf16 vs
  FP8 bytes.
- ``overlap``: MoE layer forward step time with chunked overlap vs without.

Times are medians over iterations of the slowest rank's time. Writes
``benchmarks/results/ep_transports.json`` (a run of some sections keeps the others' figures).
``--quick`` shrinks every shape.
"""

from __future__ import annotations

import argparse
import json
import os
from dataclasses import replace
from pathlib import Path

from benchmarks._common import RESULTS, write_json
from benchmarks.records.ep_transports import EpTransports
from nobubble.bench.ep_fastpath import (
    SECTIONS,
    Shape,
    memcpy_gbps,
    run_hierarchical,
    run_low_latency,
    run_overlap,
    run_transports,
)
from nobubble.bench.ep_tables import (
    print_hierarchical,
    print_low_latency,
    print_overlap,
    print_transports,
)
from nobubble.moe import MoEConfig

PICTURE = Path(__file__).resolve().parents[1] / "docs" / "img" / "ep_overlap_timeline.png"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="small shapes, a few seconds")
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--tokens", type=int, default=4096)
    p.add_argument("--hidden", type=int, default=7168)
    p.add_argument("--experts", type=int, default=256)
    p.add_argument("--topk", type=int, default=8)
    p.add_argument("--iters", type=int, default=5)
    p.add_argument("--sections", default=",".join(SECTIONS), help="comma-separated subset")
    args = p.parse_args(argv)
    if args.quick:
        args.tokens, args.hidden, args.iters = 512, 1024, 3
    sections = [s for s in args.sections.split(",") if s]
    unknown = sorted(set(sections) - set(SECTIONS))
    if unknown:
        p.error(f"--sections: unknown {unknown}; choose from {list(SECTIONS)}")
    shape = Shape(args.ranks, args.tokens, args.hidden, args.experts, args.topk, args.iters)
    name = "ep_transports" + ("_quick" if args.quick else "")
    previous = RESULTS / f"{name}.json"
    data: dict = json.loads(previous.read_text()) if previous.exists() else {}
    data["quick"] = args.quick
    if "transports" in sections:
        memcpy = memcpy_gbps(256 << 20 if not args.quick else 64 << 20)
        data["transports"] = run_transports(shape, memcpy)
        print_transports(data["transports"])
    if "hierarchical" in sections:
        tokens = args.tokens // 4 if not args.quick else args.tokens
        data["hierarchical"] = run_hierarchical(replace(shape, tokens=tokens))
        print_hierarchical(data["hierarchical"])
    if "low_latency" in sections:
        tokens = 32 if args.quick else 128
        data["low_latency"] = run_low_latency(
            replace(shape, tokens=tokens, iters=2 * args.iters + 4)
        )
        print_low_latency(data["low_latency"])
    if "overlap" in sections:
        hidden = 512 if args.quick else 2048
        config = MoEConfig(hidden=hidden, expert_hidden=256, num_experts=16, topk=4)
        tokens = 256 if args.quick else 1024
        picture = None if args.quick else PICTURE
        data["overlap"] = run_overlap(tokens, config, iters=args.iters, picture=picture)
        if picture is not None:
            print(f"wrote {picture}")
        print_overlap(data["overlap"])
    data["load_average"] = os.getloadavg()
    data.pop("machine", None)
    path = write_json(name, EpTransports, data)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
