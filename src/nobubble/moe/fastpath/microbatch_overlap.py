"""Two microbatches through one pipeline stage: the all-to-all of one under the compute of the other.

A transformer block with a MoE layer is ``dense -> route -> dispatch -> experts -> combine``:
the dense part (attention, MLP: the user's module) and the experts compute, dispatch and
combine only move rows. Within one microbatch each step waits for the one before it; two
microbatches have no such dependency, so DualPipe (DeepSeek-V3, section 3.2.1) pairs them:
the communication of microbatch ``A`` runs while microbatch ``B`` computes. Here one
communication thread runs every dispatch and combine, and the main thread every compute::

    compute:  P0 P1 E0 P2 E1 P3 E2 E3          P dense part + routing, E experts (+ shared)
    comm:        D0 D1 C0 D2 C1 D3 C2 C3       D dispatch, C combine

Dispatch ``i`` runs under the dense part of microbatch ``i + 1``, dispatch ``i + 1`` and
combine ``i - 1`` under the experts of microbatch ``i``. The communication order is the same
on every rank (one thread, fed in program order), which collectives of one group require;
it is the order of :func:`~nobubble.moe.fastpath.overlap.overlapped_forward`'s chunks, whose
pipeline and recorder this module reuses, with the dense part as each chunk's preparation.

It is a forward pass (``no_grad``: prefill, inference, the forward half of a pipeline stage);
the backward pass is not overlapped here. Like ``overlapped_forward`` it does not all-gather
the per-expert load statistics.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import nn

from nobubble.moe.fastpath.overlap import (
    StepTimes,
    _combine,
    _dispatch,
    _pipelined,
    _Recorder,
    _routed_experts,
)
from nobubble.moe.handle import DispatchResult
from nobubble.moe.routing import Routing

if TYPE_CHECKING:  # the layer (and its Buffer) sit above the fast paths
    from nobubble.moe.layer import MoELayer

__all__ = ["MicrobatchOverlapResult", "microbatch_overlapped_forward"]

COMPUTE_CATS = ("dense", "experts", "shared")
"""Event categories of the main thread's compute (lane 0)."""


@dataclass(frozen=True, eq=False, kw_only=True)
class MicrobatchOverlapResult(StepTimes):
    """What :func:`microbatch_overlapped_forward` returns: ``outs``, one ``[..., H]`` tensor
    per microbatch (``layer(pre(x_i))``), and the :class:`~.overlap.StepTimes` of the whole
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
