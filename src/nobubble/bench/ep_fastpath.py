"""Measure the MoE fast paths against their baselines, in the same processes.

Used by ``benchmarks/ep_transports.py`` (full DeepEP-sized shapes) and by the fast-path step of
``nobubble demo`` (small shapes). Every section spawns real local gloo ranks:

- ``transports``: Buffer dispatch + combine with gloo's all-to-all, with the shared-memory
  transport's collective path, and with its fused peer-write path
  (:class:`~nobubble.moe.fastpath.shm_rows.ShmRows`, with and without its C kernel and
  recycled outputs); bandwidth as a fraction of one core's memcpy bandwidth.
- ``hierarchical``: 2 "nodes" x 2 ranks; bytes that cross node boundaries, hierarchical vs flat.
- ``low_latency``: low-latency dispatch + combine vs normal mode, bf16 vs FP8 bytes.
- ``overlap``: MoE layer forward step time with chunked overlap vs without.

Times are medians over iterations of the slowest rank's time; iterations of the compared paths
are interleaved so that bursts of load from other jobs hit every path alike. All figures are
CPU measurements.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from nobubble.distributed import spawn
from nobubble.files import save_figure
from nobubble.moe.buffer import Buffer
from nobubble.moe.fastpath.hierarchical import Topology
from nobubble.moe.fastpath.overlap import communication_hidden, overlapped_forward
from nobubble.moe.fastpath.shm_transport import ShmTransport
from nobubble.moe.layer import MoEConfig, MoELayer, init_moe_weights
from nobubble.moe.transport import Capabilities, TorchDistTransport

__all__ = [
    "SECTIONS",
    "TRANSPORT_PATHS",
    "Shape",
    "memcpy_gbps",
    "run_transports",
    "run_hierarchical",
    "run_low_latency",
    "run_overlap",
    "draw_overlap",
    "fastpath_problems",
]

SECTIONS = ("transports", "hierarchical", "low_latency", "overlap")
TRANSPORT_PATHS = {
    "gloo": "Buffer over gloo all-to-all (baseline)",
    "shm-unfused": "Buffer over ShmTransport's all-to-all (no peer writes declared)",
    "shm-fused-torch": "Buffer over shm, peer writes, torch reduce, fresh outputs",
    "shm": "Buffer over shm: fused copies + C combine kernel + recycled outputs",
}


@dataclass(frozen=True)
class Shape:
    """One problem size: ``ranks`` processes, ``tokens`` x ``hidden`` bf16 tokens per rank,
    top-``topk`` of ``experts`` experts, ``iters`` timed iterations per path."""

    ranks: int = 4
    tokens: int = 4096
    hidden: int = 7168
    experts: int = 256
    topk: int = 8
    iters: int = 5

    def as_dict(self) -> dict[str, int | str]:
        return {
            "ranks": self.ranks,
            "tokens": self.tokens,
            "hidden": self.hidden,
            "experts": self.experts,
            "topk": self.topk,
            "dtype": "bf16",
        }


def memcpy_gbps(nbytes: int, repeats: int = 5) -> float:
    """One core's copy bandwidth (read + write counted once, as a transport counts bytes)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        src = torch.ones(nbytes, dtype=torch.uint8)
        dst = torch.empty_like(src)
        dst.copy_(src)  # fault the pages in
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            dst.copy_(src)
            times.append(time.perf_counter() - t0)
    finally:
        torch.set_num_threads(threads)
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


def _tokens(num_tokens: int, hidden: int, seed: int) -> torch.Tensor:
    x = torch.randn(num_tokens, hidden, generator=torch.Generator().manual_seed(seed))
    return x.to(torch.bfloat16)


def _time_once(buf: Buffer, x, idx, w, num_experts: int):
    """One dispatch + combine; the slowest rank's times."""
    dist.barrier()
    t0 = time.perf_counter()
    res = buf.dispatch(x, idx, w, num_experts=num_experts)
    t1 = time.perf_counter()
    out = buf.combine(res.recv_x, res.handle).combined_x
    t2 = time.perf_counter()
    return _slowest(t1 - t0), _slowest(t2 - t1), res, out


def _time_buffer(buf: Buffer, x, idx, w, num_experts: int, iters: int) -> dict:
    _time_once(buf, x, idx, w, num_experts)  # warm-up (grows shared-memory regions)
    disp, comb = [], []
    for _ in range(iters):
        d, c, res, out = _time_once(buf, x, idx, w, num_experts)
        disp.append(d)
        comb.append(c)
    return {
        "dispatch_s": statistics.median(disp),
        "combine_s": statistics.median(comb),
        "recv_x": res.recv_x,
        "combined": out,
    }


# -- transports ------------------------------------------------------------------------------
def _transports_rank(ctx, shape: Shape) -> dict[str, Any]:
    idx, w = _routing(shape.tokens, shape.experts, shape.topk, seed=ctx.rank)
    x = _tokens(shape.tokens, shape.hidden, seed=99 + ctx.rank)
    shm = ShmTransport(timeout_s=600)
    unfused = ShmTransport(timeout_s=600)
    unfused.capabilities = Capabilities()  # declares no peer writes: the collective path
    bufs = {
        "gloo": Buffer(transport=TorchDistTransport(timeout_s=600)),
        "shm-unfused": Buffer(transport=unfused),
        "shm-fused-torch": Buffer(transport=shm, recycle_outputs=0, fused_kernels=False),
        "shm": Buffer(transport=shm),
    }
    names = list(bufs)
    times: dict[str, dict[str, list[float]]] = {n: {"d": [], "c": []} for n in names}
    for buf in bufs.values():  # warm-up: sizes the shared-memory regions, builds the kernel
        _time_once(buf, x, idx, w, shape.experts)
    for it in range(shape.iters):  # round-robin, so that bursts of load hit every path alike
        for name in names[it % len(names) :] + names[: it % len(names)]:
            d, c, res, out = _time_once(bufs[name], x, idx, w, shape.experts)
            times[name]["d"].append(d)
            times[name]["c"].append(c)
            del res, out  # nothing from one run stays alive during the next
    _, _, want, want_out = _time_once(bufs["gloo"], x, idx, w, shape.experts)
    bit_equal = True
    for name in names[1:]:
        _, _, res, out = _time_once(bufs[name], x, idx, w, shape.experts)
        bit_equal &= torch.equal(res.recv_x, want.recv_x) and torch.equal(out, want_out)
        del res, out
    del want, want_out
    result: dict[str, Any] = {}
    for name, buf in bufs.items():
        buf.transport.reset_stats()
        buf.dispatch(x, idx, w, num_experts=shape.experts)
        result[name] = {
            "dispatch_s": statistics.median(times[name]["d"]),
            "combine_s": statistics.median(times[name]["c"]),
            "x_bytes_sent": buf.transport.stats().bytes_sent["x"],
        }
    for buf in bufs.values():
        buf.close()
    result["bit_equal"] = bool(bit_equal)
    return result


def run_transports(shape: Shape, memcpy: float) -> dict[str, Any]:
    """Dispatch + combine on every path of :data:`TRANSPORT_PATHS`; ``memcpy`` in GB/s."""
    results = spawn(_transports_rank, shape.ranks, args=(shape,), timeout_s=1800)
    rows = {}
    for name in TRANSPORT_PATHS:
        r0 = results[0][name]
        total_bytes = sum(r[name]["x_bytes_sent"] for r in results)
        t = r0["dispatch_s"] + r0["combine_s"]
        rows[name] = {
            "dispatch_ms": 1e3 * r0["dispatch_s"],
            "combine_ms": 1e3 * r0["combine_s"],
            "dispatch_plus_combine_ms": 1e3 * t,
            "bytes_per_direction": total_bytes,
            "dispatch_gbps_per_rank": total_bytes / shape.ranks / r0["dispatch_s"] / 1e9,
            "combine_gbps_per_rank": total_bytes / shape.ranks / r0["combine_s"] / 1e9,
            "aggregate_gbps": 2 * total_bytes / t / 1e9,
        }
        rows[name]["fraction_of_memcpy"] = rows[name]["aggregate_gbps"] / memcpy
    speedup = rows["gloo"]["dispatch_plus_combine_ms"] / rows["shm"]["dispatch_plus_combine_ms"]
    return {
        "shape": shape.as_dict(),
        "memcpy_gbps_single_core": memcpy,
        "rows": rows,
        "speedup_shm_over_gloo": speedup,
        "bit_equal": all(r["bit_equal"] for r in results),
    }


# -- hierarchical ----------------------------------------------------------------------------
def _hier_rank(ctx, shape: Shape, ranks_per_node: int) -> dict[str, Any]:
    p, tokens, hidden = ranks_per_node, shape.tokens, shape.hidden
    idx, w = _routing(tokens, shape.experts, shape.topk, seed=10 + ctx.rank)
    x = _tokens(tokens, hidden, seed=ctx.rank)
    flat = Buffer(transport=TorchDistTransport(timeout_s=600))
    hier = Buffer(topology=Topology(ranks_per_node=p), timeout_s=600)
    assert hier.hierarchical is not None
    out: dict[str, Any] = {}
    recv = {}
    for name, buf in (("flat", flat), ("hierarchical", hier)):
        r = _time_buffer(buf, x, idx, w, shape.experts, shape.iters)
        out[name] = {"dispatch_s": r["dispatch_s"], "combine_s": r["combine_s"]}
        recv[name] = r["recv_x"]
    out["bit_equal_dispatch"] = bool(torch.equal(recv["flat"], recv["hierarchical"]))
    hier.hierarchical.inter.reset_stats()
    res = hier.dispatch(x, idx, w, num_experts=shape.experts)
    in_rank = res.handle.is_token_in_rank.view(tokens, -1, p)  # (N, D, P)
    other = torch.ones(in_rank.shape[1], dtype=torch.bool)
    other[ctx.rank // p] = False
    elt = x.element_size()
    out["pairs_token_other_node"] = int(in_rank.any(dim=2)[:, other].sum())
    out["inter_bytes_hier"] = hier.hierarchical.inter.stats().bytes_sent_remote["x"]
    out["inter_bytes_flat"] = int(in_rank[:, other].sum()) * hidden * elt
    out["formula_holds"] = out["inter_bytes_hier"] == out["pairs_token_other_node"] * hidden * elt
    hier.close()
    return out


def run_hierarchical(shape: Shape) -> dict[str, Any]:
    """2 nodes x 2 ranks (``shape.ranks`` is ignored): inter-node bytes and times."""
    res = spawn(_hier_rank, 4, args=(shape, 2), timeout_s=1800)
    return {
        "shape": {"nodes": 2, "ranks_per_node": 2, **shape.as_dict(), "ranks": 4},
        "inter_node_bytes_hierarchical": sum(r["inter_bytes_hier"] for r in res),
        "inter_node_bytes_flat": sum(r["inter_bytes_flat"] for r in res),
        "distinct_token_node_pairs": sum(r["pairs_token_other_node"] for r in res),
        "formula_holds": all(r["formula_holds"] for r in res),
        "bit_equal_dispatch": all(r["bit_equal_dispatch"] for r in res),
        "rows": {
            name: {
                "dispatch_ms": 1e3 * res[0][name]["dispatch_s"],
                "combine_ms": 1e3 * res[0][name]["combine_s"],
            }
            for name in ("flat", "hierarchical")
        },
    }


# -- low latency -----------------------------------------------------------------------------
def _ll_rank(ctx, shape: Shape) -> dict[str, Any]:
    tokens, hidden, iters = shape.tokens, shape.hidden, shape.iters
    idx, w = _routing(tokens, shape.experts, shape.topk, seed=20 + ctx.rank)
    x = _tokens(tokens, hidden, seed=ctx.rank)
    out = {}
    for transport in ("shm", "dist"):
        ll = Buffer(None, shape.experts, transport=transport, timeout_s=600)
        for use_fp8 in (False, True):
            name = f"low-latency {transport}" + (" fp8" if use_fp8 else " bf16")
            times_d, times_c = [], []
            for it in range(iters + 1):
                ll.transport.reset_stats()
                dist.barrier()
                t0 = time.perf_counter()
                res = ll.low_latency_dispatch(
                    x, idx, num_max_dispatch_tokens_per_rank=tokens, use_fp8=use_fp8
                )
                t1 = time.perf_counter()
                ll.low_latency_combine(res.recv_x, idx, w, res.handle)
                t2 = time.perf_counter()
                if it:  # the first call sizes the buffers
                    times_d.append(_slowest(t1 - t0))
                    times_c.append(_slowest(t2 - t1))
            out[name] = {
                "dispatch_s": statistics.median(times_d),
                "combine_s": statistics.median(times_c),
                "dispatch_bytes": ll.transport.stats().bytes_sent_remote["ll_dispatch"],
            }
        ll.close()
    for name, buf in (
        ("normal gloo", Buffer(transport=TorchDistTransport(timeout_s=600))),
        ("normal shm", Buffer(transport="shm", timeout_s=600)),
    ):
        r = _time_buffer(buf, x, idx, w, shape.experts, iters)
        buf.transport.reset_stats()
        buf.dispatch(x, idx, w, num_experts=shape.experts)
        out[name] = {
            "dispatch_s": r["dispatch_s"],
            "combine_s": r["combine_s"],
            "dispatch_bytes": buf.transport.stats().bytes_sent_remote["x"],
        }
        buf.close()
    return out


def run_low_latency(shape: Shape) -> dict[str, Any]:
    """Low-latency (shm and torch.distributed, bf16 and FP8) vs normal mode at ``shape``."""
    res = spawn(_ll_rank, shape.ranks, args=(shape,), timeout_s=1800)
    rows = {}
    for name in res[0]:
        r0 = res[0][name]
        rows[name] = {
            "dispatch_us": 1e6 * r0["dispatch_s"],
            "combine_us": 1e6 * r0["combine_s"],
            "dispatch_bytes_all_ranks": sum(r[name]["dispatch_bytes"] for r in res),
        }
    fp8_ratio = (
        rows["low-latency shm fp8"]["dispatch_bytes_all_ranks"]
        / rows["low-latency shm bf16"]["dispatch_bytes_all_ranks"]
    )
    shape_d = {**shape.as_dict(), "tokens_per_rank": shape.tokens}
    shape_d.pop("tokens")
    return {"shape": shape_d, "rows": rows, "fp8_over_bf16_bytes": fp8_ratio}


# -- overlap ---------------------------------------------------------------------------------
_OVERLAP_MODES = {
    "no overlap": (1, False),
    "chunked sequential": (None, False),
    "chunked overlap": (None, True),
}


def _overlap_rank(ctx, tokens: int, config: MoEConfig, chunks: int, iters: int, transport: str):
    buf = Buffer(transport="shm" if transport == "shm" else "dist", timeout_s=600)
    layer = MoELayer(config, init_moe_weights(config, seed=1), buf)
    x = torch.randn(tokens, config.hidden, generator=torch.Generator().manual_seed(ctx.rank))
    modes = {name: (c or chunks, ov) for name, (c, ov) in _OVERLAP_MODES.items()}
    runs: dict[str, list] = {name: [] for name in modes}
    for num_chunks, overlap in modes.values():  # warm-up
        overlapped_forward(layer, x, num_chunks=num_chunks, overlap=overlap)
    names = list(modes)
    timeline = {}
    for it in range(iters):  # round-robin against bursts of load
        for name in names[it % 3 :] + names[: it % 3]:
            num_chunks, overlap = modes[name]
            dist.barrier()
            r = overlapped_forward(layer, x, num_chunks=num_chunks, overlap=overlap)
            runs[name].append((_slowest(r.step_s), r.comm_s, r.compute_s, communication_hidden(r)))
            timeline[name] = [(e.name, e.cat, e.start_us, e.dur_us, e.lane) for e in r.events]
    medians = {
        name: [statistics.median(v[i] for v in vals) for i in range(4)]
        for name, vals in runs.items()
    }
    buf.close()
    return {"medians": medians, "timeline": timeline}


def draw_overlap(timeline: dict, path: Path) -> Path:
    """Two-lane Gantt (experts / communication) of one step without and with overlap."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colours = {"dispatch": "tab:blue", "combine": "tab:orange", "experts": "tab:green"}
    modes = ["no overlap", "chunked overlap"]
    fig, axes = plt.subplots(len(modes), 1, figsize=(10, 3.2), sharex=True)
    for ax, mode in zip(axes, modes, strict=True):
        for name, cat, start, dur, lane in timeline[mode]:
            ax.barh(lane, dur / 1e3, left=start / 1e3, color=colours[cat], edgecolor="black")
            ax.text((start + dur / 2) / 1e3, lane, name, ha="center", va="center", fontsize=7)
        ax.set_yticks([0, 1], ["experts", "comm"])
        ax.set_title(f"{mode} (rank 0, shared-memory transport, CPU)", fontsize=9)
    axes[-1].set_xlabel("ms from the start of the MoE layer step")
    fig.tight_layout()
    save_figure(fig, path, dpi=110)
    plt.close(fig)
    return path


def run_overlap(
    tokens: int, config: MoEConfig, *, chunks: int = 4, iters: int = 5, picture: Path | None = None
) -> dict[str, Any]:
    """MoE layer forward on 2 ranks, gloo and shm: no overlap / chunked / chunked + overlap.

    ``picture``: where to draw the shm run's timeline (:func:`draw_overlap`), if anywhere.
    """
    out = {}
    for transport in ("gloo", "shm"):
        rank0 = spawn(
            _overlap_rank, 2, args=(tokens, config, chunks, iters, transport), timeout_s=1800
        )[0]
        res = rank0["medians"]
        if transport == "shm" and picture is not None:
            draw_overlap(rank0["timeline"], picture)
        base = res["no overlap"][0]
        out[transport] = {
            name: {
                "step_ms": 1e3 * v[0],
                "comm_ms": 1e3 * v[1],
                "experts_ms": 1e3 * v[2],
                "communication_hidden": v[3],
                "speedup_vs_no_overlap": base / v[0],
            }
            for name, v in res.items()
        }
    return {
        "shape": {
            "ranks": 2,
            "tokens_per_rank": tokens,
            "hidden": config.hidden,
            "expert_hidden": config.expert_hidden,
            "experts": config.num_experts,
            "topk": config.topk,
            "chunks": chunks,
            "dtype": "fp32",
        },
        "rows": out,
    }


def fastpath_problems(results: dict[str, Any]) -> list[str]:
    """What is wrong in ``results`` (section name -> that section's ``run_*`` result; absent
    sections are not checked): shared memory not bit-equal to gloo, hierarchical dispatch not
    equal to flat or not moving the distinct (token, node) pairs' bytes, FP8 not halving the
    bytes. Empty when every fast path agrees with its baseline."""
    checks = {
        "transports": [("shared-memory results differ from gloo's", "bit_equal")],
        "hierarchical": [("hierarchical dispatch differs from flat", "bit_equal_dispatch"),
                         ("hierarchical bytes != distinct (token, node) pairs x H x 2",
                          "formula_holds")],
    }  # fmt: skip
    problems = [what for section, rules in checks.items() if section in results
                for what, key in rules if not results[section][key]]  # fmt: skip
    low = results.get("low_latency")
    if low is not None and low["fp8_over_bf16_bytes"] >= 0.6:
        problems.append("FP8 does not halve the bytes")
    return problems
