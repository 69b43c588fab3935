"""``ep bench``: Buffer against two baselines, in the same processes, on ``R`` local ranks.

Methods (:data:`METHODS`), all moving the same routing through one transport
(``BenchConfig.transport``; the report names the one really used): ``buffer``
(:class:`~nobubble.moe.buffer.Buffer`, one copy per (token, rank)), ``per-pair all-to-all``
(one copy per (token, expert) pair, :func:`~nobubble.moe.baseline.pair_dispatch`) and
``all-gather`` (every rank gathers every token; combine reduce-scatters ``[R * N, H]``). Per
method and phase: the median over iterations of the slowest rank's time, the *logical*
bandwidth (Buffer's deduplicated payload, ``sum(is_token_in_rank) * H * element_size`` per
rank, over that time), the bytes really moved (summed over ranks) and a correctness verdict.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from nobubble.bench.ep_config import DTYPE_NAMES, BenchConfig, MethodResult
from nobubble.distributed import spawn
from nobubble.files import figure
from nobubble.moe.baseline import pair_combine, pair_dispatch
from nobubble.moe.buffer import Buffer
from nobubble.moe.layout import get_dispatch_layout
from nobubble.moe.transport import Transport

__all__ = [
    "BenchConfig",
    "MethodResult",
    "BenchReport",
    "run_bench",
    "run_with_progress",
    "run_transports",
    "plot_report",
    "METHODS",
]

METHODS = ("buffer", "per-pair all-to-all", "all-gather")
DTYPES = dict(zip(DTYPE_NAMES, (torch.bfloat16, torch.float32), strict=True))


@dataclass(frozen=True)
class BenchReport:
    """The whole run: config, the logical bytes (Buffer's dedup payload, all ranks), the
    transport really used (``"shm"`` or ``"dist"``, ``config.transport`` resolved), methods."""

    config: BenchConfig
    logical_bytes: int
    transport: str
    methods: list[MethodResult] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class _Phase:
    ms: float
    payload: int
    remote: int
    metadata: int


def _phase(transport: Transport, fn: Callable[[], Any]) -> tuple[Any, _Phase]:
    """Run ``fn`` after a barrier; time it and read what the transport moved for it."""
    transport.reset_stats()
    dist.barrier(group=getattr(transport, "group", None))
    start = time.perf_counter()
    out = fn()
    ms = (time.perf_counter() - start) * 1e3
    st = transport.stats()
    payload = st.bytes_sent.get("x", 0)
    return out, _Phase(ms, payload, st.bytes_sent_remote.get("x", 0), st.total_sent() - payload)


def _check(y: torch.Tensor, x: torch.Tensor, copies: torch.Tensor, rtol: float = 0.0):
    """``(ok, verdict)``: whether ``y`` is ``x * copies`` (identity experts; ``copies`` (N,)),
    exactly or within ``rtol`` (sums in the payload dtype)."""
    expected = (x.float() * copies.unsqueeze(1)).to(x.dtype)
    if torch.equal(y, expected):
        return True, "exact"
    if rtol and torch.allclose(y.float(), expected.float(), rtol=rtol, atol=0):
        return True, "within rounding (sums in payload dtype)"
    return False, "MISMATCH"


def _buffer_round(buf: Buffer, x, topk_idx, copies):
    res, d = _phase(buf.transport, lambda: buf.dispatch(x, topk_idx))
    comb, c = _phase(buf.transport, lambda: buf.combine(res.recv_x, res.handle))
    exact, verdict = _check(comb.combined_x, x, copies)
    bytes_ok = d.payload == int(copies.sum()) * x.shape[1] * x.element_size()
    verdict += ", bytes = logical" if bytes_ok else ", BYTES WRONG"
    return d, c, exact and bytes_ok, verdict


def _pair_round(t: Transport, x, topk_idx, num_experts: int):
    pairs, d = _phase(t, lambda: pair_dispatch(x, topk_idx, None, num_experts, t))
    y, c = _phase(t, lambda: pair_combine(pairs.recv_rows, pairs, x.shape[0], t))
    return d, c, *_check(y, x, (topk_idx >= 0).sum(1))


def _allgather_dispatch(x, topk_idx, t: Transport, num_experts: int):
    """Gather every rank's tokens, keep rows with an expert on this rank (rank, token order)."""
    local = num_experts // t.world_size
    gathered_x = t.all_gather(x, kind="x")  # (R * N, H)
    gathered_idx = t.all_gather(topk_idx, kind="topk_idx")  # (R * N, K)
    first = t.rank * local
    mine = ((gathered_idx >= first) & (gathered_idx < first + local)).any(dim=1)  # (R * N,)
    rows = mine.nonzero().squeeze(1)  # (M,)
    return gathered_x.index_select(0, rows), rows


def _allgather_round(t: Transport, x, topk_idx, num_experts: int, copies):
    (recv_x, rows), d = _phase(t, lambda: _allgather_dispatch(x, topk_idx, t, num_experts))

    def combine():
        full = torch.zeros((t.world_size * x.shape[0], x.shape[1]), dtype=x.dtype)  # (R * N, H)
        full.index_copy_(0, rows, recv_x)
        return t.reduce_scatter(full, kind="x")  # (N, H), summed in the payload dtype

    y, c = _phase(t, combine)
    return d, c, *_check(y, x, copies, 2**-7 if x.dtype == torch.bfloat16 else 1e-6)


def _rank_body(ctx, config: BenchConfig, progress: Any) -> dict[str, Any]:
    dtype = DTYPES[config.dtype]
    g = torch.Generator().manual_seed(config.seed * 1000 + ctx.rank)
    n, h, e = config.num_tokens, config.hidden, config.num_experts
    x = torch.randn(n, h, generator=g).to(dtype)  # (N, H)
    topk_idx = torch.randn(n, e, generator=g).topk(config.topk, dim=1).indices  # (N, K)
    copies = get_dispatch_layout(topk_idx, e, ctx.world_size).is_token_in_rank.sum(1)  # (N,)
    with Buffer(None, e, transport=config.transport, timeout_s=config.timeout_s) as buf:
        out = _run_methods(ctx, config, progress, buf, x, topk_idx, copies)
        out["transport"] = buf.transport.kind
    return out  # the buffer is closed: no shared memory left behind


def _run_methods(ctx, config: BenchConfig, progress: Any, buf: Buffer, x, topk_idx, copies):
    e, h, t = config.num_experts, config.hidden, buf.transport
    rounds = {
        "buffer": lambda: _buffer_round(buf, x, topk_idx, copies),
        "per-pair all-to-all": lambda: _pair_round(t, x, topk_idx, e),
        "all-gather": lambda: _allgather_round(t, x, topk_idx, e, copies),
    }
    total, done = len(rounds) * (config.num_warmup + config.num_iters), 0
    out: dict[str, Any] = {"logical_bytes": int(copies.sum()) * h * x.element_size()}
    for name in METHODS:
        phases, oks, verdicts = [], [], []
        for it in range(config.num_warmup + config.num_iters):
            d, c, ok, verdict = rounds[name]()
            oks.append(ok)
            verdicts.append(verdict)
            if it >= config.num_warmup:
                phases.append((d, c))
            done += 1
            if ctx.rank == 0 and progress is not None:
                progress.put((name, done, total))
        out[name] = {"phases": phases, "ok": all(oks), "verdict": verdicts[-1]}
    return out


def run_bench(config: BenchConfig, *, progress: Any = None) -> BenchReport:
    """Spawn ``config.num_ranks`` processes (one thread each), run every method, gather the report.

    ``progress``: an optional queue from ``nobubble.distributed.worker_context()`` that rank 0
    feeds with ``(method, done, total)`` tuples.
    """
    per_rank = spawn(
        _rank_body, config.num_ranks, args=(config, progress), timeout_s=config.timeout_s
    )
    logical = sum(r["logical_bytes"] for r in per_rank)
    per_rank_logical = logical / config.num_ranks
    methods = []
    for name in METHODS:
        ranks = [r[name] for r in per_rank]
        iters = range(len(ranks[0]["phases"]))
        figures: dict[str, Any] = {}
        for i, phase in enumerate(("dispatch", "combine")):
            ms = statistics.median(max(r["phases"][it][i].ms for r in ranks) for it in iters)
            first = [r["phases"][0][i] for r in ranks]
            figures[f"{phase}_ms"] = ms
            figures[f"{phase}_logical_gbps"] = per_rank_logical / (ms / 1e3) / 1e9
            figures[f"{phase}_payload_bytes"] = sum(p.payload for p in first)
            figures[f"{phase}_remote_bytes"] = sum(p.remote for p in first)
            if phase == "dispatch":
                figures["dispatch_metadata_bytes"] = sum(p.metadata for p in first)
        correct = all(r["ok"] for r in ranks)
        verdict = ranks[0]["verdict"] if correct else "MISMATCH on some rank"
        methods.append(MethodResult(method=name, **figures, correct=correct, verdict=verdict))
    return BenchReport(config, logical, per_rank[0]["transport"], methods)


def run_with_progress(config: BenchConfig) -> BenchReport:
    """:func:`run_bench` while a progress bar on stderr follows rank 0's methods."""
    from nobubble.bench.output import run_with_progress_bar

    return run_with_progress_bar(
        lambda updates: run_bench(config, progress=updates),
        label=f"starting {config.num_ranks} ranks",
    )


def run_transports(config: BenchConfig, kinds: tuple[str, ...] | None = None) -> list[BenchReport]:
    """:func:`run_with_progress` once per transport kind (default: ``config.transport``), one
    after the other, so that the same :class:`Buffer` is compared across transports."""
    from dataclasses import replace

    return [run_with_progress(replace(config, transport=k)) for k in kinds or (config.transport,)]


def plot_report(report: dict[str, Any], path: Path) -> Path:
    """Bar charts of time and bytes per method from :meth:`BenchReport.to_dict` (PNG or SVG)."""
    methods = report["methods"]
    names = [m["method"] for m in methods]
    pos = list(range(len(names)))
    with figure(path, 1, 2, figsize=(10, 3.6)) as (fig, (ax1, ax2)):
        for offset, key in ((-0.2, "dispatch"), (0.2, "combine")):
            x = [p + offset for p in pos]
            ax1.bar(x, [m[f"{key}_ms"] for m in methods], width=0.4, label=key)
            ax2.bar(x, [m[f"{key}_payload_bytes"] / 1e6 for m in methods], width=0.4, label=key)
        ax2.axhline(report["logical_bytes"] / 1e6, color="k", ls="--", lw=1, label="logical")
        c = report["config"]
        c = {k.removeprefix("num_"): v for k, v in c.items()}  # reports before the num_ names too
        transport = report.get("transport", "dist")  # reports written before the field: gloo
        for ax, ylabel in ((ax1, "ms (slowest rank, median)"), (ax2, "MB moved (all ranks)")):
            ax.set_xticks(pos, names, fontsize=8)
            ax.set_ylabel(ylabel)
            ax.legend(fontsize=8)
        fig.suptitle(
            f"{c['ranks']} ranks x {c['tokens']} tokens x {c['hidden']} {c['dtype']}, "
            f"top-{c['topk']} of {c['experts']} experts, {transport} transport (CPU)",
            fontsize=10,
        )
    return path
