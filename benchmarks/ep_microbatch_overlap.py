"""Benchmark: one microbatch's expert-parallel all-to-all under another's compute (DualPipe).

A pipeline stage here is a dense part (LayerNorm -> Linear H->2H -> GELU -> Linear 2H->H)
followed by an expert-parallel MoE layer (gloo ``Buffer``), run over 2 microbatches by
:func:`~nobubble.moe.fastpath.overlap.microbatch_overlapped_forward`: overlapped
(dispatch / combine of one microbatch on a communication thread while the main thread runs the
other's dense part and experts) against sequential (the same operations on the main thread).
Two layouts:

- ``EP=2``: 2 ranks, one expert-parallel group;
- ``PP=2 x EP=2``: 4 ranks as two EP groups of 2 (``dp_ep_groups(2, 2)``), each group one
  pipeline stage; both stages run their microbatches at the same time, as in a pipeline's
  steady state (the activations between stages are not sent here).

Overlapped and sequential alternate (which goes first flips every repeat), after one warm-up
each; a step's time is that of the slowest rank; ``speedup`` is the ratio of the medians,
``speedup_paired`` the median of each repeat's ratio (the two runs back to back). Writes
``benchmarks/results/ep_microbatch_overlap.json`` (medians, sequential / overlapped ratio,
hidden-communication fraction, the machine's cores and load).

    python -m benchmarks.ep_microbatch_overlap            # 3 sizes x 2 layouts, ~3-6 min here
    python -m benchmarks.ep_microbatch_overlap --quick    # smoke run, one small size, no file
"""

from __future__ import annotations

import argparse
import os
import statistics

import torch
import torch.distributed as dist
from torch import nn

from benchmarks._common import write_json
from benchmarks.records.ep_microbatch_overlap import EpMicrobatchOverlap
from nobubble.distributed import spawn
from nobubble.moe import Buffer, MoEConfig, MoELayer, dp_ep_groups, init_moe_weights
from nobubble.moe.fastpath.overlap import communication_hidden, microbatch_overlapped_forward

NAME = "ep_microbatch_overlap"
SIZES = ((512, 512), (1024, 1024), (2048, 1024))  # (tokens per microbatch per rank, hidden)
QUICK_SIZES = ((128, 256),)
LAYOUTS = {"EP=2": (1, 2), "PP=2 x EP=2": (2, 2)}  # name: (EP groups = pipeline stages, EP)
NUM_EXPERTS, TOPK, NUM_MICROBATCHES = 8, 2, 2


def moe_config(hidden: int) -> MoEConfig:
    return MoEConfig(
        hidden=hidden,
        expert_hidden=hidden // 2,
        num_experts=NUM_EXPERTS,
        topk=TOPK,
        num_shared_experts=1,
    )


def dense_part(hidden: int) -> nn.Module:
    """The stage's dense part (an MLP block standing in for attention + MLP)."""
    torch.manual_seed(0)
    return nn.Sequential(
        nn.LayerNorm(hidden),
        nn.Linear(hidden, 2 * hidden),
        nn.GELU(),
        nn.Linear(2 * hidden, hidden),
    )


def _slowest(seconds: float) -> float:
    t = torch.tensor([seconds], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t)


def _rank(ctx, num_stages: int, ep: int, sizes, repeats: int) -> list[dict]:
    grid = dp_ep_groups(num_stages, ep, timeout_s=600)
    out = []
    for tokens, hidden in sizes:
        config = moe_config(hidden)
        layer = MoELayer(config, init_moe_weights(config, seed=1), Buffer(grid.ep_group))
        pre = dense_part(hidden)
        g = torch.Generator().manual_seed(ctx.rank)
        xs = [torch.randn(tokens, hidden, generator=g) for _ in range(NUM_MICROBATCHES)]
        runs: dict[bool, list] = {True: [], False: []}
        bit_equal = True
        for overlap in (True, False):  # warm-up
            microbatch_overlapped_forward(pre, layer, xs, overlap=overlap)
        for rep in range(repeats):
            outs = {}
            for overlap in (True, False) if rep % 2 == 0 else (False, True):
                dist.barrier()  # every stage starts together
                r = microbatch_overlapped_forward(pre, layer, xs, overlap=overlap)
                outs[overlap] = r.outs
                step = _slowest(r.step_s)
                runs[overlap].append((step, r.comm_s, r.compute_s, communication_hidden(r)))
            bit_equal &= all(
                torch.equal(a, b) for a, b in zip(outs[True], outs[False], strict=True)
            )
        out.append({"tokens": tokens, "hidden": hidden, "runs": runs, "bit_equal": bit_equal})
    return out


def _row(layout: str, ranks: int, per_rank: list[dict]) -> dict:
    """Medians over repeats: step of the slowest rank; comm / compute / hidden pooled over ranks."""

    def med(overlap: bool, i: int) -> float:
        return statistics.median(v[i] for r in per_rank for v in r["runs"][overlap])

    seq, ovl = med(False, 0), med(True, 0)
    # the slowest rank's steps (the same on every rank), paired by repeat: ran back to back
    steps = zip(per_rank[0]["runs"][False], per_rank[0]["runs"][True], strict=True)
    paired = statistics.median(s[0] / o[0] for s, o in steps)
    return {
        "layout": layout,
        "ranks": ranks,
        "tokens_per_microbatch": per_rank[0]["tokens"],
        "hidden": per_rank[0]["hidden"],
        "sequential_step_ms": 1e3 * seq,
        "overlapped_step_ms": 1e3 * ovl,
        "speedup": seq / ovl,
        "speedup_paired": paired,
        "sequential_comm_ms": 1e3 * med(False, 1),
        "overlapped_comm_ms": 1e3 * med(True, 1),
        "sequential_compute_ms": 1e3 * med(False, 2),
        "overlapped_compute_ms": 1e3 * med(True, 2),
        "communication_hidden": med(True, 3),
        "bit_equal": all(r["bit_equal"] for r in per_rank),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one small size, writes no file")
    parser.add_argument("--repeats", type=int, default=None, help="default 11 (quick: 3)")
    args = parser.parse_args()
    sizes = QUICK_SIZES if args.quick else SIZES
    repeats = args.repeats or (3 if args.quick else 11)
    load_before = os.getloadavg()
    rows = []
    for layout, (num_stages, ep) in LAYOUTS.items():
        ranks = num_stages * ep
        res = spawn(_rank, ranks, args=(num_stages, ep, sizes, repeats), timeout_s=1800)
        for i in range(len(sizes)):
            row = _row(layout, ranks, [r[i] for r in res])
            rows.append(row)
            print(
                f"{layout:12s} {row['tokens_per_microbatch']:5d} x {row['hidden']:5d}: "
                f"sequential {row['sequential_step_ms']:7.1f} ms, overlapped "
                f"{row['overlapped_step_ms']:7.1f} ms, speedup {row['speedup']:.2f}x (paired "
                f"{row['speedup_paired']:.2f}x), comm "
                f"{row['sequential_comm_ms']:.1f} -> {row['overlapped_comm_ms']:.1f} ms, "
                f"hidden {100 * row['communication_hidden']:.0f}%, bit-equal {row['bit_equal']}",
                flush=True,
            )
    if not all(r["bit_equal"] for r in rows):
        raise SystemExit("overlapped and sequential outputs differ")
    if args.quick:
        return
    data = {
        "config": {
            "num_microbatches": NUM_MICROBATCHES,
            "num_experts": NUM_EXPERTS,
            "topk": TOPK,
            "expert_hidden": "hidden / 2",
            "num_shared_experts": 1,
            "dense_part": "LayerNorm, Linear H->2H, GELU, Linear 2H->H",
            "dtype": "fp32",
            "transport": "gloo (Buffer over torch.distributed)",
            "repeats": repeats,
            "threads_per_rank": 1,
        },
        "cpu_count": os.cpu_count(),
        "load_average_before": load_before,
        "load_average": os.getloadavg(),
        "rows": rows,
    }
    print(f"wrote {write_json(NAME, EpMicrobatchOverlap, data)}")


if __name__ == "__main__":
    main()
