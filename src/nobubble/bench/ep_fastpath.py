"""Measure the MoE fast paths against their baselines, in the same processes (real local gloo
ranks; all figures are CPU measurements).

Sections (:data:`SECTIONS`): ``transports`` (Buffer over each path of
:data:`TRANSPORT_PATHS`; bandwidth as a fraction of one core's memcpy), ``hierarchical`` (2
"nodes" x 2 ranks: bytes that cross node boundaries, hierarchical vs flat), ``low_latency``
(low-latency vs normal mode, bf16 vs FP8 bytes) and ``overlap`` (MoE layer step time with
chunked overlap vs without). Times are medians over iterations of the slowest rank's time;
the compared paths' iterations are interleaved (:func:`_interleave`).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import torch
import torch.distributed as dist

from nobubble.distributed import spawn
from nobubble.files import figure
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

T = TypeVar("T")
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
        """The shape as written into results: every field but ``iters``, and the dtype."""
        return {**{k: v for k, v in asdict(self).items() if k != "iters"}, "dtype": "bf16"}


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
    return _slowest_each(seconds)[0]


def _slowest_each(*seconds: float) -> tuple[float, ...]:
    """The slowest rank's value of each of ``seconds``, in one all-reduce."""
    t = torch.tensor(seconds, dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return tuple(t.tolist())


def _inputs(shape: Shape, routing_seed: int, token_seed: int):
    """This rank's bf16 tokens ``(N, H)``, top-k expert ids and weights ``(N, K)``."""
    g = torch.Generator().manual_seed(routing_seed)
    scores = torch.randn(shape.tokens, shape.experts, generator=g).softmax(dim=1)
    weights, idx = scores.topk(shape.topk, dim=1)
    g = torch.Generator().manual_seed(token_seed)
    x = torch.randn(shape.tokens, shape.hidden, generator=g).to(torch.bfloat16)
    return x, idx, weights


def _round(buf: Buffer, x, idx, w, num_experts: int, fp8: bool | None = None):
    """One dispatch + combine after a barrier (``fp8`` not None: in low-latency mode, FP8 or
    bf16); the slowest rank's ``(dispatch, combine)`` seconds."""
    dist.barrier()
    t0 = time.perf_counter()
    res: Any
    if fp8 is None:
        res = buf.dispatch(x, idx, w, num_experts=num_experts)
    else:
        tokens = x.shape[0]
        res = buf.low_latency_dispatch(x, idx, num_max_dispatch_tokens_per_rank=tokens, use_fp8=fp8)
    t1 = time.perf_counter()
    if fp8 is None:
        buf.combine(res.recv_x, res.handle)
    else:
        buf.low_latency_combine(res.recv_x, idx, w, res.handle)
    t2 = time.perf_counter()  # before any collective: the combine's time is the combine's
    dispatch_s, combine_s = _slowest_each(t1 - t0, t2 - t1)
    return dispatch_s, combine_s


def _interleave(runs: Mapping[str, Callable[[], T]], iters: int) -> dict[str, list[T]]:
    """One untimed warm-up call of every run (it sizes shared-memory regions, builds kernels),
    then ``iters`` rounds calling each once, each round starting one run further, so that
    bursts of load from other jobs hit every run alike. Returns every run's results."""
    for run in runs.values():
        run()
    names = list(runs)
    out: dict[str, list[T]] = {name: [] for name in names}
    for it in range(iters):
        k = it % len(names)
        for name in names[k:] + names[:k]:
            out[name].append(runs[name]())
    return out


def _medians(times: list[tuple[float, float]]) -> dict[str, float]:
    """``{"dispatch_s", "combine_s"}``: the medians of ``(dispatch, combine)`` seconds."""
    return {
        "dispatch_s": statistics.median(t[0] for t in times),
        "combine_s": statistics.median(t[1] for t in times),
    }


def _stats(transport: Any, run: Callable[[], Any]) -> Any:
    """What ``run()`` alone moves through ``transport`` (its ``stats()``)."""
    transport.reset_stats()
    run()
    return transport.stats()


def _outputs(buf: Buffer, x, idx, w, num_experts: int) -> tuple[torch.Tensor, torch.Tensor]:
    """One untimed dispatch + combine: the rows received and the combined tokens."""
    res = buf.dispatch(x, idx, w, num_experts=num_experts)
    return res.recv_x, buf.combine(res.recv_x, res.handle).combined_x


# -- transports ------------------------------------------------------------------------------
def _transports_rank(ctx, shape: Shape) -> dict[str, Any]:
    x, idx, w = _inputs(shape, ctx.rank, 99 + ctx.rank)
    shm = ShmTransport(timeout_s=600)
    unfused = ShmTransport(timeout_s=600)
    unfused.capabilities = Capabilities()  # declares no peer writes: the collective path
    bufs = {
        "gloo": Buffer(transport=TorchDistTransport(timeout_s=600)),
        "shm-unfused": Buffer(transport=unfused),
        "shm-fused-torch": Buffer(transport=shm, recycle_outputs=0, fused_kernels=False),
        "shm": Buffer(transport=shm),
    }
    args = (x, idx, w, shape.experts)
    times = _interleave(
        {name: partial(_round, buf, *args) for name, buf in bufs.items()}, shape.iters
    )
    want = _outputs(bufs["gloo"], *args)
    bit_equal = True
    for name in list(bufs)[1:]:  # compared at once: a recycled output is overwritten next time
        bit_equal &= all(torch.equal(a, b) for a, b in zip(_outputs(bufs[name], *args), want))
    result: dict[str, Any] = {"bit_equal": bool(bit_equal)}
    for name, buf in bufs.items():
        send = partial(buf.dispatch, x, idx, w, num_experts=shape.experts)
        result[name] = {
            **_medians(times[name]),
            "x_bytes_sent": _stats(buf.transport, send).bytes_sent["x"],
        }
    for buf in bufs.values():
        buf.close()
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
    x, idx, w = _inputs(shape, 10 + ctx.rank, ctx.rank)
    flat = Buffer(transport=TorchDistTransport(timeout_s=600))
    hier = Buffer(topology=Topology(ranks_per_node=p), timeout_s=600)
    assert hier.hierarchical is not None
    args = (x, idx, w, shape.experts)
    times = _interleave(
        {"flat": partial(_round, flat, *args), "hierarchical": partial(_round, hier, *args)},
        shape.iters,
    )
    out: dict[str, Any] = {name: _medians(t) for name, t in times.items()}
    flat_x = flat.dispatch(x, idx, w, num_experts=shape.experts).recv_x
    hier.hierarchical.inter.reset_stats()
    res = hier.dispatch(x, idx, w, num_experts=shape.experts)
    out["bit_equal_dispatch"] = bool(torch.equal(flat_x, res.recv_x))
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
    x, idx, w = _inputs(shape, 20 + ctx.rank, ctx.rank)
    runs: dict[str, Callable[[], tuple[float, float]]] = {}
    sent: dict[str, tuple[Any, Callable[[], Any], str]] = {}  # what dispatch_bytes measures
    bufs = []
    for transport in ("shm", "dist"):
        ll = Buffer(None, shape.experts, transport=transport, timeout_s=600)
        bufs.append(ll)
        for use_fp8 in (False, True):
            name = f"low-latency {transport}" + (" fp8" if use_fp8 else " bf16")
            runs[name] = partial(_round, ll, x, idx, w, shape.experts, use_fp8)
            sent[name] = (ll.transport, runs[name], "ll_dispatch")
    for name, buf in (
        ("normal gloo", Buffer(transport=TorchDistTransport(timeout_s=600))),
        ("normal shm", Buffer(transport="shm", timeout_s=600)),
    ):
        bufs.append(buf)
        runs[name] = partial(_round, buf, x, idx, w, shape.experts)
        sent[name] = (
            buf.transport,
            partial(buf.dispatch, x, idx, w, num_experts=shape.experts),
            "x",
        )
    times = _interleave(runs, shape.iters)
    _dispatch_bytes = lambda t, run, kind: _stats(t, run).bytes_sent_remote[kind]  # noqa: E731
    out = {
        name: {**_medians(times[name]), "dispatch_bytes": _dispatch_bytes(*sent[name])}
        for name in runs
    }
    for buf in bufs:
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

    def step(num_chunks: int, overlap: bool) -> Any:
        dist.barrier()
        return overlapped_forward(layer, x, num_chunks=num_chunks, overlap=overlap)

    runs = {name: partial(step, c or chunks, ov) for name, (c, ov) in _OVERLAP_MODES.items()}
    results = _interleave(runs, iters)
    medians = {
        name: [
            statistics.median(column)
            for column in zip(
                *[(_slowest(r.step_s), r.comm_s, r.compute_s, communication_hidden(r)) for r in rs]
            )
        ]
        for name, rs in results.items()
    }
    timeline = {
        name: [(e.name, e.cat, e.start_us, e.dur_us, e.lane) for e in rs[-1].events]
        for name, rs in results.items()
    }
    buf.close()
    return {"medians": medians, "timeline": timeline}


def draw_overlap(timeline: dict, path: Path) -> Path:
    """Two-lane Gantt (experts / communication) of one step without and with overlap."""
    colours = {"dispatch": "tab:blue", "combine": "tab:orange", "experts": "tab:green"}
    modes = ["no overlap", "chunked overlap"]
    with figure(path, len(modes), 1, figsize=(10, 3.2), sharex=True) as (_, axes):
        for ax, mode in zip(axes, modes, strict=True):
            for name, cat, start, dur, lane in timeline[mode]:
                ax.barh(lane, dur / 1e3, left=start / 1e3, color=colours[cat], edgecolor="black")
                ax.text((start + dur / 2) / 1e3, lane, name, ha="center", va="center", fontsize=7)
            ax.set_yticks([0, 1], ["experts", "comm"])
            ax.set_title(f"{mode} (rank 0, shared-memory transport, CPU)", fontsize=9)
        axes[-1].set_xlabel("ms from the start of the MoE layer step")
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
