"""Expert-parallel fast paths on CPU: shared memory vs gloo, hierarchical, low-latency, FP8, overlap.

Every section spawns real local ranks (gloo) and runs its baseline in the same processes:

- ``transports``: Buffer dispatch + combine, 4 ranks, 4096 x 7168 bf16 tokens, top-8 of 256
  experts, with gloo's all-to-all and with the shared-memory transport; bandwidth as a
  fraction of one core's memcpy bandwidth, measured in the same run.
- ``hierarchical``: 2 "nodes" x 2 ranks; bytes that cross node boundaries, hierarchical vs flat.
- ``low_latency``: 128 tokens per rank, low-latency dispatch + combine vs normal mode, bf16 vs
  FP8 bytes.
- ``overlap``: MoE layer forward step time with chunked overlap vs without.

Times are medians over iterations of the slowest rank's time. Writes
``benchmarks/results/ep_transports.json``. ``--quick`` shrinks every shape.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from _common import write_json  # noqa: E402

from nobubble.cliutil import print_table  # noqa: E402
from nobubble.distributed import spawn  # noqa: E402
from nobubble.moe import Buffer, TorchDistTransport  # noqa: E402
from nobubble.moe.buffer_shm import ShmBuffer  # noqa: E402
from nobubble.moe.transport_shm import ShmTransport  # noqa: E402

SECTIONS = ("transports", "hierarchical", "low_latency", "overlap")


def memcpy_gbps(nbytes: int, repeats: int = 5) -> float:
    """One core's copy bandwidth (read + write counted once, as a transport counts bytes)."""
    torch.set_num_threads(1)
    src = torch.ones(nbytes, dtype=torch.uint8)
    dst = torch.empty_like(src)
    dst.copy_(src)  # fault the pages in
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        dst.copy_(src)
        times.append(time.perf_counter() - t0)
    return nbytes / statistics.median(times) / 1e9


def _slowest(seconds: float) -> float:
    t = torch.tensor([seconds], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t)


def _routing(num_tokens: int, num_experts: int, topk: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    scores = torch.randn(num_tokens, num_experts, generator=g).softmax(dim=1)
    weights, idx = scores.topk(topk, dim=1)
    return idx, weights


def _time_buffer(buf: Buffer, x, idx, w, num_experts: int, iters: int) -> dict:
    res = buf.dispatch(x, idx, w, num_experts=num_experts)  # warm-up (grows shm regions)
    buf.combine(res.recv_x, res.handle)
    disp, comb = [], []
    for _ in range(iters):
        dist.barrier()
        t0 = time.perf_counter()
        res = buf.dispatch(x, idx, w, num_experts=num_experts)
        t1 = time.perf_counter()
        out = buf.combine(res.recv_x, res.handle).combined_x
        t2 = time.perf_counter()
        disp.append(_slowest(t1 - t0))
        comb.append(_slowest(t2 - t1))
    return {
        "dispatch_s": statistics.median(disp),
        "combine_s": statistics.median(comb),
        "recv_x": res.recv_x,
        "combined": out,
    }


def _transports_rank(ctx, tokens: int, hidden: int, num_experts: int, topk: int, iters: int):
    idx, w = _routing(tokens, num_experts, topk, seed=ctx.rank)
    x = torch.randn(tokens, hidden, generator=torch.Generator().manual_seed(99 + ctx.rank))
    x = x.to(torch.bfloat16)
    out = {}
    recv = {}
    for name in ("gloo", "shm-unfused", "shm"):
        if name == "gloo":
            buf = Buffer(transport=TorchDistTransport(timeout_s=600))
        elif name == "shm-unfused":  # the plain Buffer over the shared-memory transport
            buf = Buffer(transport=ShmTransport(timeout_s=600))
        else:  # gather-on-write / reduce-on-read over shared memory
            buf = ShmBuffer(timeout_s=600)
        transport = buf.transport
        r = _time_buffer(buf, x, idx, w, num_experts, iters)
        recv[name] = (r.pop("recv_x"), r.pop("combined"))
        transport.reset_stats()
        buf.dispatch(x, idx, w, num_experts=num_experts)
        r["x_bytes_sent"] = transport.stats().bytes_sent["x"]
        out[name] = r
        if isinstance(transport, ShmTransport):
            transport.close()
    out["bit_equal"] = all(
        torch.equal(recv["gloo"][k], recv[name][k]) for name in recv for k in (0, 1)
    )
    return out


def run_transports(args, memcpy: float) -> dict:
    results = spawn(
        _transports_rank,
        args.ranks,
        args=(args.tokens, args.hidden, args.experts, args.topk, args.iters),
        timeout_s=1800,
    )
    rows = {}
    for name in ("gloo", "shm-unfused", "shm"):
        r0 = results[0][name]
        total_bytes = sum(r[name]["x_bytes_sent"] for r in results)
        t = r0["dispatch_s"] + r0["combine_s"]
        rows[name] = {
            "dispatch_ms": 1e3 * r0["dispatch_s"],
            "combine_ms": 1e3 * r0["combine_s"],
            "dispatch_plus_combine_ms": 1e3 * t,
            "bytes_per_direction": total_bytes,
            "dispatch_gbps_per_rank": total_bytes / args.ranks / r0["dispatch_s"] / 1e9,
            "combine_gbps_per_rank": total_bytes / args.ranks / r0["combine_s"] / 1e9,
            "aggregate_gbps": 2 * total_bytes / t / 1e9,
        }
        rows[name]["fraction_of_memcpy"] = rows[name]["aggregate_gbps"] / memcpy
    speedup = rows["gloo"]["dispatch_plus_combine_ms"] / rows["shm"]["dispatch_plus_combine_ms"]
    return {
        "shape": {
            "ranks": args.ranks,
            "tokens": args.tokens,
            "hidden": args.hidden,
            "experts": args.experts,
            "topk": args.topk,
            "dtype": "bf16",
        },
        "memcpy_gbps_single_core": memcpy,
        "rows": rows,
        "speedup_shm_over_gloo": speedup,
        "bit_equal": all(r["bit_equal"] for r in results),
    }


def print_transports(res: dict) -> None:
    rows = [
        [
            name,
            f"{r['dispatch_ms']:.1f}",
            f"{r['combine_ms']:.1f}",
            f"{r['dispatch_gbps_per_rank']:.2f}",
            f"{r['combine_gbps_per_rank']:.2f}",
            f"{r['aggregate_gbps']:.2f}",
            f"{r['fraction_of_memcpy']:.2f}",
        ]
        for name, r in res["rows"].items()
    ]
    print_table(
        "dispatch + combine (CPU measurement)",
        [
            "transport",
            "dispatch ms",
            "combine ms",
            "disp GB/s/rank",
            "comb GB/s/rank",
            "aggregate GB/s",
            "x memcpy",
        ],
        rows,
        caption=f"{res['shape']}; single-core memcpy {res['memcpy_gbps_single_core']:.2f} GB/s; "
        f"shm speedup {res['speedup_shm_over_gloo']:.1f}x; bit-equal: {res['bit_equal']}",
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="small shapes, a few seconds")
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--tokens", type=int, default=4096)
    p.add_argument("--hidden", type=int, default=7168)
    p.add_argument("--experts", type=int, default=256)
    p.add_argument("--topk", type=int, default=8)
    p.add_argument("--iters", type=int, default=3)
    p.add_argument("--sections", default=",".join(SECTIONS))
    args = p.parse_args(argv)
    if args.quick:
        args.tokens, args.hidden, args.iters = 512, 1024, 3
    sections = [s for s in args.sections.split(",") if s]
    memcpy = memcpy_gbps(256 << 20 if not args.quick else 64 << 20)
    data: dict = {"quick": args.quick}
    if "transports" in sections:
        data["transports"] = run_transports(args, memcpy)
        print_transports(data["transports"])
    path = write_json("ep_transports" + ("_quick" if args.quick else ""), data)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
