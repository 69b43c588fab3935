"""Overlap of expert-parallel communication with compute: token chunks, or microbatches.

:func:`overlapped_forward` cuts one batch's tokens into ``C`` chunks;
:func:`microbatch_overlapped_forward` runs a stage ``layer(pre(x))`` over several microbatches
(DualPipe's pairing, DeepSeek-V3 3.2.1). Both run every dispatch and combine on one
communication thread, fed in the same order on every rank (as collectives of one group
require), while the main thread computes::

    comm:        D0 D1 C0 D2 C1 D3 C2 ...    D dispatch, C combine
    compute:  P0 P1 E0 P2 E1 P3 E2 E3 ...    P dense part + routing (microbatches), E experts

Both reuse the layer's router, buffer, experts and shared experts, are forward passes
(``no_grad``), and do not all-gather the per-expert load statistics. See
``docs/moe/fastpath.md``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import nn

from nobubble.moe.handle import DispatchResult
from nobubble.moe.routing import Routing
from nobubble.trace import Event

if TYPE_CHECKING:  # the layer (and its Buffer) sit above the fast paths
    from nobubble.moe.layer import MoELayer

__all__ = [
    "StepTimes",
    "OverlapResult",
    "MicrobatchOverlapResult",
    "overlapped_forward",
    "microbatch_overlapped_forward",
    "communication_hidden",
]


@dataclass(frozen=True, eq=False, kw_only=True)
class StepTimes:
    """A step's wall time, the time its communication and compute operations took, and
    what ran where (the result of both overlaps, :class:`OverlapResult` and
    :class:`MicrobatchOverlapResult`).

    Attributes:
        step_s: wall time of the step on this rank.
        comm_s: time the communication operations took (sum over dispatch and combine calls).
        compute_s: time the compute operations took (sum).
        events: one :class:`~nobubble.trace.Event` per operation, lane 0 compute, lane 1
            communication, microseconds from the step's start.
    """

    step_s: float
    comm_s: float
    compute_s: float
    events: list[Event]


@dataclass(frozen=True, eq=False, kw_only=True)
class OverlapResult(StepTimes):
    """What :func:`overlapped_forward` returns: ``out``, ``[..., H]`` the layer's output, and
    the :class:`StepTimes` (compute: the experts, summed over chunks)."""

    out: torch.Tensor


def communication_hidden(result: StepTimes) -> float:
    """Fraction of a step's communication time that ran while the main thread computed.

    The main thread either computes or waits; the time it does not compute
    (``step - compute``) bounds the communication left exposed, so
    ``hidden = 1 - (step - compute) / comm``, clipped to [0, 1]. A sequential run has
    ``step >= compute + comm`` and scores 0.
    """
    if result.comm_s <= 0:
        return 0.0
    exposed = result.step_s - result.compute_s
    return min(1.0, max(0.0, 1.0 - exposed / result.comm_s))


class _Recorder:
    """Times operations into :class:`~nobubble.trace.Event` s, microseconds from its creation."""

    def __init__(self, rank: int) -> None:
        self.rank = rank
        self.origin = time.perf_counter()
        self.events: list[Event] = []

    def run(self, name: str, cat: str, lane: int, fn, *args):
        start = time.perf_counter()
        out = fn(*args)
        end = time.perf_counter()
        self.events.append(
            Event(name, cat, self.rank, 1e6 * (start - self.origin), 1e6 * (end - start), {}, lane)
        )
        return out

    def total(self, *cats: str) -> float:
        """Seconds spent in operations of the categories ``cats``."""
        return sum(e.dur_us for e in self.events if e.cat in cats) / 1e6

    def elapsed(self) -> float:
        return time.perf_counter() - self.origin


def _dispatch(
    rec: _Recorder,
    layer: MoELayer,
    name: str,
    x: torch.Tensor,
    topk_idx: torch.Tensor,
    topk_weights: torch.Tensor,
) -> DispatchResult:
    """``layer.buffer.dispatch`` of ``x [n, H]``, recorded on the communication lane."""
    num_experts = layer.config.num_experts
    return rec.run(
        name,
        "dispatch",
        1,
        lambda: layer.buffer.dispatch(x, topk_idx, topk_weights, num_experts=num_experts),
    )


def _routed_experts(layer: MoELayer, res: DispatchResult) -> torch.Tensor:
    """The layer's own experts on the received rows: ``[M, H]`` -> ``[M, H]``."""
    # a fresh (not cached) dispatch with weights returns both
    assert res.recv_topk_idx is not None and res.recv_topk_weights is not None
    return layer.run_experts(res.recv_x, res.recv_topk_idx, res.recv_topk_weights)


def _combine(
    rec: _Recorder, layer: MoELayer, name: str, y: torch.Tensor, res: DispatchResult
) -> torch.Tensor:
    """``layer.buffer.combine`` of the expert outputs ``y [M, H]``, on the communication lane."""
    return rec.run(name, "combine", 1, lambda: layer.buffer.combine(y, res.handle).combined_x)


def _pipelined(
    num_chunks: int,
    dispatch: Callable[[int], DispatchResult],
    experts: Callable[[DispatchResult, int], torch.Tensor],
    combine: Callable[[int, torch.Tensor, DispatchResult], torch.Tensor],
    timeout_s: float,
    prepare: Callable[[int], None] | None = None,
) -> list[torch.Tensor]:
    """Experts on this thread; dispatch i+1 and combine i-1 on one communication thread, in
    the order D0 D1 C0 D2 C1 ... on every rank.

    ``prepare(i)``, when given, runs on this thread just before dispatch i is queued (the
    dense part that produces chunk i's tokens): it computes while dispatch i-1 and combine
    i-2 are in flight.
    """
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="ep-comm") as comm:
        if prepare is not None:
            prepare(0)
        pending: dict[int, Future] = {0: comm.submit(dispatch, 0)}
        combines: list[Future] = []
        for i in range(num_chunks):
            if i + 1 < num_chunks:  # queued after combine i-1: both run while experts compute i
                if prepare is not None:
                    prepare(i + 1)
                pending[i + 1] = comm.submit(dispatch, i + 1)
            res = pending.pop(i).result(timeout=timeout_s)
            y = experts(res, i)
            combines.append(comm.submit(combine, i, y, res))
        return [f.result(timeout=timeout_s) for f in combines]


@torch.no_grad()
def overlapped_forward(
    layer: MoELayer,
    x: torch.Tensor,
    *,
    num_chunks: int,
    overlap: bool = True,
    timeout_s: float = 300.0,
) -> OverlapResult:
    """The layer's forward on ``num_chunks`` token chunks, communication overlapped with experts.

    Args:
        layer: an expert-parallel :class:`~nobubble.moe.layer.MoELayer`.
        x: ``[..., H]`` this rank's tokens.
        num_chunks: ``C >= 1``, the same on every rank (a rank with fewer tokens than chunks
            sends empty chunks).
        overlap: False runs the same chunks one stage after another on the main thread (the
            baseline).
        timeout_s: the longest the main thread waits for one communication operation.
    """
    if isinstance(num_chunks, bool) or not isinstance(num_chunks, int) or num_chunks < 1:
        raise ValueError(f"overlapped_forward: num_chunks={num_chunks!r} must be an int >= 1")
    shape = x.shape
    x = x.reshape(-1, shape[-1])  # (N, H)
    rec = _Recorder(layer.buffer.rank)
    routing = layer.route(x)
    bounds = torch.tensor_split(torch.arange(x.shape[0], device=x.device), num_chunks)
    chunks = [(x[b], routing.topk_idx[b], routing.topk_weights[b]) for b in bounds]

    def dispatch(i: int) -> DispatchResult:
        return _dispatch(rec, layer, f"D{i}", *chunks[i])

    def experts(res: DispatchResult, i: int) -> torch.Tensor:
        return rec.run(f"E{i}", "experts", 0, _routed_experts, layer, res)  # (M_i, H)

    def combine(i: int, y: torch.Tensor, res: DispatchResult) -> torch.Tensor:
        return _combine(rec, layer, f"C{i}", y, res)

    if overlap:
        outs = _pipelined(num_chunks, dispatch, experts, combine, timeout_s)
    else:
        outs = []
        for i in range(num_chunks):
            res = dispatch(i)
            outs.append(combine(i, experts(res, i), res))
    out = torch.cat(outs) if outs else x.new_zeros(0, shape[-1])  # (N, H)
    shared = layer.shared_out(x)
    if shared is not None:
        out = out + shared
    step = rec.elapsed()
    comm_s = rec.total("dispatch", "combine")
    return OverlapResult(
        out=out.reshape(shape), step_s=step, comm_s=comm_s, compute_s=rec.total("experts"),
        events=rec.events,
    )  # fmt: skip


COMPUTE_CATS = ("dense", "experts", "shared")
"""Event categories of the main thread's compute (lane 0)."""


@dataclass(frozen=True, eq=False, kw_only=True)
class MicrobatchOverlapResult(StepTimes):
    """What :func:`microbatch_overlapped_forward` returns: ``outs``, one ``[..., H]`` tensor
    per microbatch (``layer(pre(x_i))``), and the :class:`StepTimes` of the whole
    stage (all microbatches). Compute is the dense parts, routed experts and shared experts;
    events: lane 0 compute (``P{i}`` dense + routing, ``E{i}`` routed experts, ``S{i}``
    shared experts), lane 1 communication (``D{i}``, ``C{i}``)."""

    outs: list[torch.Tensor]


@dataclass(frozen=True, eq=False)
class _Prepared:
    shape: torch.Size  # pre's output shape, [..., H]
    h: torch.Tensor  # (N_i, H)
    routing: Routing


def _check_microbatches(microbatches: Sequence[torch.Tensor]) -> None:
    if len(microbatches) < 1:
        raise ValueError(
            f"microbatch_overlapped_forward: num_microbatches={len(microbatches)}; pass a "
            "sequence of at least one [..., H] tensor, the same count on every rank"
        )
    first = microbatches[0]
    for i, x in enumerate(microbatches):
        if not isinstance(x, torch.Tensor) or x.dim() < 1:
            got = getattr(x, "shape", type(x).__name__)
            raise ValueError(
                f"microbatch_overlapped_forward: microbatch {i} is {got}; pass tensors [..., H]"
            )
        if x.shape[-1] != first.shape[-1] or x.dim() != first.dim():
            raise ValueError(
                f"microbatch_overlapped_forward: microbatch {i} has shape {tuple(x.shape)}, "
                f"microbatch 0 {tuple(first.shape)}; every microbatch needs the same number of "
                "dimensions and the same last (feature) size"
            )


@torch.no_grad()
def microbatch_overlapped_forward(
    pre: nn.Module,
    layer: MoELayer,
    microbatches: Sequence[torch.Tensor],
    *,
    overlap: bool = True,
    timeout_s: float = 300.0,
) -> MicrobatchOverlapResult:
    """``layer(pre(x))`` for every microbatch, one's communication under another's compute.

    Args:
        pre: the dense part of the stage (attention, MLP, norms: any module), applied to each
            microbatch on the main thread; its output is ``[..., H]``, ``H = layer.config.hidden``.
        layer: an expert-parallel :class:`~nobubble.moe.layer.MoELayer` (its router, buffer,
            experts - built in or the user's - and shared experts are used as they are).
        microbatches: ``M >= 1`` tensors ``[..., D]`` (one ``D``; token counts may differ,
            0 included); ``M`` must be the same on every rank of the layer's group.
        overlap: False runs the same operations one after another on the main thread (the
            baseline: ``P0 D0 E0 C0 P1 D1 ...``); the outputs are bit-identical.
        timeout_s: the longest the main thread waits for one communication operation.
    """
    _check_microbatches(microbatches)
    num_microbatches = len(microbatches)
    hidden = layer.config.hidden
    rec = _Recorder(layer.buffer.rank)
    prepared: list[_Prepared] = []
    shared: list[torch.Tensor | None] = []

    def dense(i: int) -> _Prepared:
        out = pre(microbatches[i])  # (..., H)
        if not isinstance(out, torch.Tensor) or out.dim() < 1 or out.shape[-1] != hidden:
            got = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
            raise ValueError(
                f"microbatch_overlapped_forward: pre module {type(pre).__name__} returned "
                f"{got} for microbatch {i}; the MoE layer takes [..., hidden={hidden}]"
            )
        h = out.reshape(-1, hidden)  # (N_i, H)
        return _Prepared(out.shape, h, layer.route(h))

    def prepare(i: int) -> None:
        prepared.append(rec.run(f"P{i}", "dense", 0, dense, i))

    def dispatch(i: int) -> DispatchResult:
        p = prepared[i]
        return _dispatch(rec, layer, f"D{i}", p.h, p.routing.topk_idx, p.routing.topk_weights)

    def experts(res: DispatchResult, i: int) -> torch.Tensor:
        y = rec.run(f"E{i}", "experts", 0, _routed_experts, layer, res)  # (M_i, H)
        if layer.shared is not None:  # computed here, added once combine i is back
            shared.append(rec.run(f"S{i}", "shared", 0, layer.shared_out, prepared[i].h))
        else:
            shared.append(None)
        return y

    def combine(i: int, y: torch.Tensor, res: DispatchResult) -> torch.Tensor:
        return _combine(rec, layer, f"C{i}", y, res)

    if overlap:
        combined = _pipelined(num_microbatches, dispatch, experts, combine, timeout_s, prepare)
    else:
        combined = []
        for i in range(num_microbatches):
            prepare(i)
            res = dispatch(i)
            combined.append(combine(i, experts(res, i), res))
    outs = []
    for p, out, s in zip(prepared, combined, shared, strict=True):
        outs.append((out if s is None else out + s).reshape(p.shape))  # (..., H)
    step = rec.elapsed()
    comm_s = rec.total("dispatch", "combine")
    return MicrobatchOverlapResult(
        outs=outs, step_s=step, comm_s=comm_s, compute_s=rec.total(*COMPUTE_CATS),
        events=rec.events,
    )  # fmt: skip
