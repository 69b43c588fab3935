"""Chunked overlap of expert-parallel communication with expert computation.

A MoE layer's step is dispatch -> experts -> combine, and without overlap the experts wait for
the whole dispatch and the combine waits for all experts. Cutting the tokens into ``C``
chunks lets the three stages form a pipeline: while the experts compute chunk ``i`` on the
main thread, a communication thread runs the combine of chunk ``i - 1`` and the dispatch of
chunk ``i + 1``::

    comm:    D0 D1 C0 D2 C1 D3 C2 ...       (one thread, the same order on every rank)
    compute:    E0    E1    E2    E3 ...

Collectives of one group must be issued in the same order on every rank; a single
communication thread fed in a fixed order guarantees it. :func:`overlapped_forward` reuses the
layer's own pieces (router, :class:`~nobubble.moe.buffer.Buffer`, experts, shared experts) and
returns the same output as the layer for the same chunks, plus a timeline of what ran where.
It is a forward pass (prefill / inference step): the backward pass is not overlapped here.
Unlike ``MoELayer.forward`` it does not all-gather the per-expert load statistics.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from nobubble.moe.handle import DispatchResult
from nobubble.trace import Event

if TYPE_CHECKING:  # the layer (and its Buffer) sit above the fast paths
    from nobubble.moe.layer import MoELayer

__all__ = ["StepTimes", "OverlapResult", "overlapped_forward", "communication_hidden"]


@dataclass(frozen=True, eq=False, kw_only=True)
class StepTimes:
    """A step's wall time, the time its communication and compute operations took, and
    what ran where (the result of both overlaps, :class:`OverlapResult` and
    :class:`~nobubble.moe.fastpath.microbatch_overlap.MicrobatchOverlapResult`).

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
