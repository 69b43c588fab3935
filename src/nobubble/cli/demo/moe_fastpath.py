"""``nobubble demo`` step for the MoE fast paths (DeepEP's mechanisms on a CPU host).

Four local gloo ranks, small shapes: dispatch + combine over gloo's all-to-all vs shared
memory (bit-equal, timed in the same run), hierarchical dispatch over 2 "nodes" x 2 ranks
(the bytes that cross node boundaries vs flat), low-latency mode vs normal mode with bf16 and
FP8 payloads, and a MoE layer step with chunked overlap of communication and experts. Writes
``moe/fastpaths.json`` and ``moe/ep_overlap_timeline.png``. ``benchmarks/ep_transports.py``
runs the same code at DeepEP's sizes.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from nobubble.bench.ep_fastpath import (
    Shape,
    fastpath_problems,
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
from nobubble.cli.util import console
from nobubble.files import write_text
from nobubble.moe.layer import MoEConfig

__all__ = ["run"]


def run(out_dir: Path, quick: bool) -> list[Path]:
    """Run every fast path beside its baseline; returns the artifacts under ``out_dir``."""
    shape = (
        Shape(ranks=4, tokens=256, hidden=512, experts=32, topk=4, iters=2)
        if quick
        else Shape(ranks=4, tokens=1024, hidden=2048, experts=64, topk=8, iters=3)
    )
    con = console()
    con.print(
        f"MoE fast paths on {shape.ranks} gloo ranks: {shape.tokens} x {shape.hidden} bf16 tokens "
        f"per rank, top-{shape.topk} of {shape.experts} experts (CPU; shared memory is this "
        "host's NVLink)"
    )
    # overlap pays off only when a chunk's experts take longer than its fixed costs
    config = MoEConfig(hidden=512 if quick else 2048, expert_hidden=128 if quick else 256,
                       num_experts=16, topk=4)  # fmt: skip
    picture = out_dir / "moe" / "ep_overlap_timeline.png"
    res = {"transports": run_transports(shape, memcpy_gbps(64 << 20))}
    print_transports(res["transports"])
    res["hierarchical"] = run_hierarchical(replace(shape, tokens=shape.tokens // 2))
    print_hierarchical(res["hierarchical"])
    res["low_latency"] = run_low_latency(replace(shape, tokens=32, iters=4))
    print_low_latency(res["low_latency"])
    res["overlap"] = run_overlap(256 if quick else 1024, config, iters=2 if quick else 3,
                                 picture=picture)  # fmt: skip
    print_overlap(res["overlap"])
    rows, hier = res["transports"]["rows"], res["hierarchical"]
    con.print(
        f"shared memory vs gloo, dispatch + combine: {rows['gloo']['dispatch_plus_combine_ms']:.1f}"
        f" -> {rows['shm']['dispatch_plus_combine_ms']:.1f} ms "
        f"({res['transports']['speedup_shm_over_gloo']:.1f}x, bit-equal "
        f"{res['transports']['bit_equal']}); hierarchical crosses nodes with "
        f"{hier['inter_node_bytes_hierarchical'] / hier['inter_node_bytes_flat']:.3f} of flat's "
        f"bytes; FP8 / bf16 bytes {res['low_latency']['fp8_over_bf16_bytes']:.3f}; chunked "
        f"overlap hid {100 * res['overlap']['rows']['shm']['chunked overlap']['communication_hidden']:.0f}%"
        " of the communication"
    )
    summary = out_dir / "moe" / "fastpaths.json"
    summary.parent.mkdir(parents=True, exist_ok=True)
    write_text(summary, json.dumps(res, indent=2) + "\n")
    problems = fastpath_problems(res)
    if problems:
        raise RuntimeError("MoE fast paths: " + "; ".join(problems))
    return [summary, picture]
