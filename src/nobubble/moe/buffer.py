"""DeepEP-style expert-parallel dispatch and combine (normal / throughput mode).

A :class:`Buffer` sends each token once to every rank that holds at least one of its top-k
experts (``dispatch``), and sums the rows that come back (``combine``). Compared with a plain
all-to-all that sends one copy per (token, expert) pair, a token with several experts on one
rank crosses the wire once.

Received rows are grouped by source rank in rank order, and by source token order within a
source rank. The :class:`~nobubble.moe.handle.DispatchHandle` records that layout;
``dispatch(x, handle=h)`` and ``combine`` reuse it without exchanging counts again, and the
backward passes of both use it (the records live in :mod:`nobubble.moe.handle`).

Shape legend: ``N`` tokens on this rank, ``H`` hidden, ``K`` top-k, ``E`` experts, ``R`` ranks,
``L = E / R`` local experts, ``S`` rows this rank sends, ``M`` rows it receives.

Extension points (later work): the payload moves through :meth:`Buffer.dispatch_rows` /
:meth:`Buffer.combine_rows`, which take any row-aligned tensor - an FP8 payload is two of
them (values and scales), chunked overlap splits them; the transport is an explicit object
(shared memory, hierarchical ``ranks_per_node`` routing, low-latency mode plug in there);
expert-parallel load balancing maps logical to physical experts on ``topk_idx`` before
``dispatch`` and reads received counts through ``cumulative_local_expert_recv_stats``.

Failures: a peer that dies or stops answering makes the transport raise
:class:`~nobubble.moe.transport.PeerFailure`, which names the phase (``layout`` while counts
and metadata are exchanged, ``dispatch`` for rows going out, ``combine`` for rows coming
back - gradients included) and the ranks that did not arrive. Over a transport with
``mask_failed_ranks=True`` the buffer instead goes on without masked ranks: the top-k slots
they held are re-routed to surviving replicas (:meth:`Buffer.set_replicas`) or dropped, and
counted (:meth:`Buffer.masking_stats`; :mod:`nobubble.moe.masking`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

import torch

from nobubble.moe.autograd import CombineFunction, DispatchFunction
from nobubble.moe.handle import CombineResult, DispatchHandle, DispatchResult
from nobubble.moe.layout import (
    DispatchLayout,
    check_topk_idx,
    get_dispatch_layout,
    num_local_experts,
)
from nobubble.moe.masking import MaskingStats, MaskLedger, without_sources
from nobubble.moe.transport import PeerFailure, TorchDistTransport, Transport

if TYPE_CHECKING:
    import torch.distributed as dist

__all__ = ["Buffer", "DispatchHandle", "DispatchResult", "CombineResult"]

_COUNT_HEADER = 3  # per-destination header in the count exchange: rows, topk, hidden
_T = TypeVar("_T")


class Buffer:
    """Expert-parallel communication buffer for one process group.

    Args:
        group: the expert-parallel ``torch.distributed`` group (``None`` = default group);
            ignored when ``transport`` is given.
        transport: moves the rows (default :class:`TorchDistTransport` over ``group``).
        num_experts: default ``E`` for :meth:`dispatch` calls that do not pass it.
        timeout_s: per-collective timeout of the default transport.
        combine_chunk_bytes: size of the float32 scratch in which combine widens 16-bit rows
            on CPU (cache-sized chunks are about twice as fast as whole segments).

    Failure masking is the transport's choice: over a
    :class:`~nobubble.moe.transport.FailureMasking` transport built with
    ``mask_failed_ranks=True`` (``ShmTransport(mask_failed_ranks=True)``), the buffer skips
    masked ranks as described in :mod:`nobubble.moe.masking`; otherwise a failed peer raises
    :class:`~nobubble.moe.transport.PeerFailure`.
    """

    def __init__(
        self,
        group: dist.ProcessGroup | None = None,
        *,
        transport: Transport | None = None,
        num_experts: int | None = None,
        timeout_s: float = 120.0,
        combine_chunk_bytes: int = 4 << 20,
    ) -> None:
        if combine_chunk_bytes < 1:
            raise ValueError(f"Buffer: combine_chunk_bytes={combine_chunk_bytes} must be >= 1")
        self.combine_chunk_bytes = combine_chunk_bytes
        self.transport: Transport = transport or TorchDistTransport(group, timeout_s=timeout_s)
        self.rank = self.transport.rank
        self.num_ranks = self.transport.world_size
        if num_experts is not None:
            num_local_experts(num_experts, self.num_ranks)
        self.num_experts = num_experts
        self._mask = MaskLedger(self.rank, self.transport)
        self.masks_failed_ranks = self._mask.enabled
        own_movers = (type(self).dispatch_rows, type(self).combine_rows) == (
            Buffer.dispatch_rows,
            Buffer.combine_rows,
        )
        if self.masks_failed_ranks and not own_movers:
            raise ValueError(
                f"{type(self).__name__}: its fused row movers do not support failure masking; "
                "use Buffer(transport=ShmTransport(mask_failed_ranks=True)) instead"
            )

    # -- failure masking --------------------------------------------------------------------
    def set_replicas(self, phy2log: torch.Tensor | None) -> None:
        """Tell the buffer the expert placement, so that slots on masked ranks go to
        surviving replicas instead of being dropped.

        Args:
            phy2log: ``[E]`` int64, the logical expert of each physical expert (EPLB's
                ``phy2log``; ``ReplicatedMoELayer.phy2log``); None forgets it.
        """
        self._mask.set_replicas(phy2log)

    def masking_stats(self) -> MaskingStats:
        """Masked ranks and the (token, slot) pairs dropped or re-routed so far."""
        return self._mask.stats()

    def _in_phase(self, phase: str, call: Callable[[], _T]) -> _T:
        """Run a transport call; a :class:`PeerFailure` from it is attributed to ``phase``."""
        try:
            return call()
        except PeerFailure as err:
            raise err.in_phase(phase) from err

    # -- layout -----------------------------------------------------------------------------
    def get_dispatch_layout(
        self, topk_idx: torch.Tensor, num_experts: int | None = None
    ) -> DispatchLayout:
        """:func:`~nobubble.moe.layout.get_dispatch_layout` for this buffer's rank count."""
        return get_dispatch_layout(topk_idx, self._num_experts(num_experts), self.num_ranks)

    def _num_experts(self, num_experts: int | None) -> int:
        value = num_experts if num_experts is not None else self.num_experts
        if value is None:
            raise ValueError("num_experts is not set; pass num_experts= to dispatch or Buffer")
        return value

    # -- dispatch ---------------------------------------------------------------------------
    def dispatch(
        self,
        x: torch.Tensor,
        topk_idx: torch.Tensor | None = None,
        topk_weights: torch.Tensor | None = None,
        *,
        handle: DispatchHandle | None = None,
        num_experts: int | None = None,
        layout: DispatchLayout | None = None,
        expert_alignment: int = 1,
        cumulative_local_expert_recv_stats: torch.Tensor | None = None,
    ) -> DispatchResult:
        """Send every token to the ranks that own its experts (differentiable).

        Args:
            x: ``[N, H]`` token rows, any dtype.
            topk_idx: ``[N, K]`` int64 expert ids, -1 = no expert. Required unless ``handle``.
            topk_weights: ``[N, K]`` floating weights, optional.
            handle: reuse a previous dispatch's layout (no count exchange); then ``topk_idx``,
                ``topk_weights`` and ``layout`` must be None.
            num_experts: ``E`` (default: the buffer's).
            layout: a precomputed :class:`DispatchLayout` for ``topk_idx``.
            expert_alignment: round each ``num_recv_tokens_per_expert`` entry up to this.
            cumulative_local_expert_recv_stats: ``[L]`` integer tensor; received (row, slot)
                counts per local expert are added into it (load-balancing statistics).
        Returns:
            :class:`DispatchResult`.
        """
        if not isinstance(x, torch.Tensor) or x.dim() != 2:
            shape = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
            raise ValueError(f"dispatch: x must be a [num_tokens, hidden] tensor, got {shape}")
        if (
            isinstance(expert_alignment, bool)
            or not isinstance(expert_alignment, int)
            or expert_alignment < 1
        ):
            raise ValueError(f"dispatch: expert_alignment={expert_alignment!r} must be an int >= 1")
        if handle is not None:
            return self._cached_dispatch(x, topk_idx, topk_weights, layout, handle)
        if topk_idx is None:
            raise ValueError("dispatch: pass topk_idx (or handle= to reuse a previous layout)")
        num_experts = self._num_experts(num_experts)
        self._check_routing(x, topk_idx, topk_weights, num_experts)
        if layout is None:
            layout = get_dispatch_layout(topk_idx, num_experts, self.num_ranks)
        elif layout.is_token_in_rank.shape != (x.shape[0], self.num_ranks):
            raise ValueError(
                f"dispatch: layout.is_token_in_rank.shape={tuple(layout.is_token_in_rank.shape)} "
                f"does not match {x.shape[0]} tokens x {self.num_ranks} ranks"
            )
        handle = self._plan(layout, topk_idx.long(), num_experts, hidden=x.shape[1])
        recv_x, recv_topk_weights = DispatchFunction.apply(self, handle, x, topk_weights)
        counts = handle.num_recv_tokens_per_expert
        if cumulative_local_expert_recv_stats is not None:
            self._add_recv_stats(cumulative_local_expert_recv_stats, counts)
        aligned = [math.ceil(c / expert_alignment) * expert_alignment for c in counts]
        return DispatchResult(recv_x, handle.recv_topk_idx, recv_topk_weights, aligned, handle)

    def _cached_dispatch(self, x, topk_idx, topk_weights, layout, handle) -> DispatchResult:
        if topk_idx is not None or topk_weights is not None or layout is not None:
            raise ValueError(
                "dispatch: with handle=, leave topk_idx, topk_weights and layout unset "
                "(the handle already fixes the layout)"
            )
        if not isinstance(handle, DispatchHandle) or handle.num_ranks != self.num_ranks:
            raise ValueError("dispatch: handle does not come from a dispatch on this group")
        if x.shape[0] != handle.num_tokens:
            raise ValueError(
                f"dispatch: x has {x.shape[0]} tokens but the handle was made for "
                f"{handle.num_tokens}; use the handle of the same batch"
            )
        recv_x, _ = DispatchFunction.apply(self, handle, x, None)
        return DispatchResult(recv_x, None, None, list(handle.num_recv_tokens_per_expert), handle)

    def _check_routing(self, x, topk_idx, topk_weights, num_experts: int) -> None:
        check_topk_idx(topk_idx, num_experts)
        if topk_idx.shape[0] != x.shape[0]:
            raise ValueError(
                f"dispatch: topk_idx has {topk_idx.shape[0]} rows but x has {x.shape[0]} tokens"
            )
        if topk_weights is None:
            return
        if not isinstance(topk_weights, torch.Tensor) or not topk_weights.is_floating_point():
            raise ValueError(
                f"dispatch: topk_weights must be a floating tensor, got "
                f"{getattr(topk_weights, 'dtype', type(topk_weights).__name__)}; use torch.float32"
            )
        if topk_weights.shape != topk_idx.shape:
            raise ValueError(
                f"dispatch: topk_weights.shape={tuple(topk_weights.shape)} must equal "
                f"topk_idx.shape={tuple(topk_idx.shape)}"
            )

    def _add_recv_stats(self, stats: torch.Tensor, counts: tuple[int, ...]) -> None:
        if stats.dim() != 1 or stats.shape[0] != len(counts) or stats.is_floating_point():
            raise ValueError(
                f"dispatch: cumulative_local_expert_recv_stats must be an integer [{len(counts)}] "
                f"tensor (one entry per local expert), got {stats.dtype} {tuple(stats.shape)}"
            )
        stats.add_(torch.tensor(counts, dtype=stats.dtype, device=stats.device))

    def _plan(
        self, layout: DispatchLayout, topk_idx: torch.Tensor, num_experts: int, *, hidden: int
    ) -> DispatchHandle:
        """Exchange counts and routing metadata; no payload moves here.

        With masking, the mask is read before and after each exchange: slots on ranks masked
        by then are taken out of the send side (the counts already sent to the survivors do
        not change), and rows from masked sources out of the receive side.
        """
        num_ranks, num_tokens, topk = self.num_ranks, topk_idx.shape[0], topk_idx.shape[1]
        local = num_local_experts(num_experts, num_ranks)
        device = topk_idx.device
        avoid = self._mask.avoid  # re-routes / drops the slots of newly masked ranks
        topk_idx, layout, masked = avoid(topk_idx, layout, frozenset(), num_experts, reroute=True)
        # (R, 3 + L): per destination, [rows, K, H, slots per expert of that rank]
        header = torch.tensor([topk, hidden], dtype=torch.int64, device=device).expand(num_ranks, 2)
        counts = torch.cat(
            [
                layout.num_tokens_per_rank.to(device, torch.int64).view(num_ranks, 1),
                header,
                layout.num_tokens_per_expert.to(device, torch.int64).view(num_ranks, local),
            ],
            dim=1,
        )
        ones = [1] * num_ranks
        recv_counts = self.transport.all_to_all(counts, ones, ones, kind="layout")  # (R, 3 + L)
        seen = masked
        topk_idx, layout, masked = avoid(topk_idx, layout, seen, num_experts)
        self._check_peers_agree(recv_counts, topk, hidden, masked)
        num_send = tuple(int(v) for v in layout.num_tokens_per_rank.tolist())
        num_recv = [0 if i in masked else int(v) for i, v in enumerate(recv_counts[:, 0].tolist())]

        # Sent rows: destination-major, token order within (nonzero is row-major).
        pairs = layout.is_token_in_rank.to(device).t().nonzero()  # (S, 2): (rank, token)
        send_token_idx = pairs[:, 1].contiguous()  # (S,)
        meta = torch.cat([send_token_idx.view(-1, 1), topk_idx[send_token_idx]], dim=1)  # (S, 1+K)
        recv_meta = self.transport.all_to_all(meta, num_send, num_recv, kind="topk_idx")
        seen = masked
        topk_idx, layout, masked = avoid(topk_idx, layout, seen, num_experts)
        if masked != seen:  # masked during this exchange: out of the send and receive sides
            num_send = tuple(int(v) for v in layout.num_tokens_per_rank.tolist())
            send_token_idx = layout.is_token_in_rank.to(device).t().nonzero()[:, 1].contiguous()
            recv_meta, num_recv = without_sources(recv_meta, num_recv, masked - seen)
        recv_topk_idx, expert_counts = self._local_slots(
            recv_meta[:, 1:], recv_counts, masked, local
        )
        return DispatchHandle(
            rank=self.rank,
            num_ranks=num_ranks,
            num_experts=num_experts,
            num_tokens=num_tokens,
            is_token_in_rank=layout.is_token_in_rank,
            send_token_idx=send_token_idx,
            num_send_tokens_per_rank=num_send,
            num_recv_tokens_per_rank=tuple(num_recv),
            recv_src_idx=recv_meta[:, 0].contiguous(),  # (M,)
            recv_topk_idx=recv_topk_idx,
            num_recv_tokens_per_expert=tuple(int(v) for v in expert_counts.tolist()),
            topk_idx=topk_idx,
        )

    def _local_slots(
        self,
        global_idx: torch.Tensor,
        recv_counts: torch.Tensor,
        masked: frozenset[int],
        local: int,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Received rows' ``[M, K]`` global expert ids -> ``(recv_topk_idx [M, K], counts [L])``:
        local ids (-1 for other ranks' slots) and received (row, slot) pairs per local expert,
        checked against the counts the ranks still present sent (``recv_counts [R, 3 + L]``)."""
        present = [i for i in range(self.num_ranks) if i not in masked]
        expert_counts = recv_counts[present, _COUNT_HEADER:].sum(dim=0)  # (L,)
        first = self.rank * local
        is_local = (global_idx >= first) & (global_idx < first + local)  # (M, K)
        recv_topk_idx = torch.where(is_local, global_idx - first, -1)  # (M, K)
        assert torch.equal(
            torch.bincount(recv_topk_idx[is_local], minlength=local), expert_counts
        ), "received expert counts disagree with the exchanged counts"
        return recv_topk_idx, expert_counts

    def _check_peers_agree(
        self, recv_counts: torch.Tensor, topk: int, hidden: int, masked: frozenset[int]
    ) -> None:
        """Every rank sees every rank's (K, H), so all of them raise together on a mismatch
        (masked ranks sent nothing and are left out)."""
        live = [i for i in range(self.num_ranks) if i not in masked]
        ks, hs = recv_counts[live, 1].tolist(), recv_counts[live, 2].tolist()
        if any(k != topk for k in ks) or any(h != hidden for h in hs):
            raise ValueError(
                f"dispatch: ranks disagree on shapes: topk per rank {ks}, hidden per rank {hs}; "
                "every rank must dispatch the same K and H"
            )

    # -- combine ----------------------------------------------------------------------------
    def combine(
        self,
        x: torch.Tensor,
        handle: DispatchHandle,
        *,
        topk_weights: torch.Tensor | None = None,
        bias: torch.Tensor | tuple[torch.Tensor, ...] | None = None,
    ) -> CombineResult:
        """Sum each token's rows from every rank that received it (differentiable).

        Args:
            x: ``[M, H]`` rows in the order dispatch delivered them (expert outputs, already
                weighted: combine itself does not apply weights, as in DeepEP's normal mode).
            handle: the dispatch's handle.
            topk_weights: ``[M, K]`` floating, optional; summed the same way.
            bias: ``[N, H]`` tensor or a tuple of up to two, added to the result.
        Returns:
            :class:`CombineResult`.
        """
        if not isinstance(handle, DispatchHandle) or handle.num_ranks != self.num_ranks:
            raise ValueError("combine: handle does not come from a dispatch on this group")
        if not isinstance(x, torch.Tensor) or x.dim() != 2 or x.shape[0] != handle.num_recv_tokens:
            shape = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
            raise ValueError(
                f"combine: x must be [{handle.num_recv_tokens}, hidden] (the rows dispatch "
                f"delivered), got {shape}"
            )
        if topk_weights is not None and (
            not topk_weights.is_floating_point()
            or topk_weights.dim() != 2
            or topk_weights.shape[0] != handle.num_recv_tokens
        ):
            raise ValueError(
                f"combine: topk_weights must be floating [{handle.num_recv_tokens}, K], got "
                f"{topk_weights.dtype} {tuple(topk_weights.shape)}"
            )
        self._mask.begin_combine()
        combined_x, combined_weights = CombineFunction.apply(self, handle, x, topk_weights)
        self._mask.count_lost_in_flight(handle.topk_idx, handle.num_experts)
        for b in _as_bias_tuple(bias):
            if b.shape != combined_x.shape:
                raise ValueError(
                    f"combine: bias.shape={tuple(b.shape)} must equal {tuple(combined_x.shape)}"
                )
            combined_x = combined_x + b
        return CombineResult(combined_x, combined_weights)

    # -- row movers (used by the autograd functions) ----------------------------------------
    def dispatch_rows(self, t: torch.Tensor, handle: DispatchHandle, *, kind: str) -> torch.Tensor:
        """``[N, *]`` -> ``[M, *]``: copy each token row to the ranks in the handle's layout."""
        send = t.index_select(0, handle.send_token_idx)  # (S, *)
        return self._in_phase(
            "dispatch",
            lambda: self.transport.all_to_all(
                send, handle.num_send_tokens_per_rank, handle.num_recv_tokens_per_rank, kind=kind
            ),
        )

    def combine_rows(self, t: torch.Tensor, handle: DispatchHandle, *, kind: str) -> torch.Tensor:
        """``[M, *]`` -> ``[N, *]``: return rows to their source ranks and sum them per token.

        Sums run in source-rank order, in float32 for 16-bit inputs, then cast back to t's
        dtype; within one source rank's segment the token indices are distinct, so the result
        is deterministic on every device. 16-bit rows are widened a few MiB at a time into one
        scratch buffer on CPU (about twice as fast as widening whole segments).
        """
        back = self._in_phase(
            "combine",
            lambda: self.transport.all_to_all(
                t, handle.num_recv_tokens_per_rank, handle.num_send_tokens_per_rank, kind=kind
            ),
        )  # (S, *) in send order; rows of masked sources read as zeros
        self._mask.note_missing_rows(kind)
        widen = t.is_floating_point() and t.element_size() < 4
        acc_dtype = torch.float32 if widen else t.dtype
        out = torch.zeros((handle.num_tokens, *t.shape[1:]), dtype=acc_dtype, device=t.device)
        chunk, scratch = max(1, back.shape[0]), None
        if widen and t.device.type == "cpu":  # on GPU one widening kernel per segment is best
            chunk = max(1, self.combine_chunk_bytes // (4 * max(1, math.prod(t.shape[1:]))))
            scratch = torch.empty((min(chunk, back.shape[0]), *t.shape[1:]), dtype=acc_dtype)
        start = 0
        for count in handle.num_send_tokens_per_rank:
            for lo in range(start, start + count, chunk):
                hi = min(start + count, lo + chunk)
                rows = back[lo:hi]
                if scratch is not None:
                    rows = scratch[: hi - lo].copy_(rows)
                elif widen:
                    rows = rows.to(acc_dtype)
                out.index_add_(0, handle.send_token_idx[lo:hi], rows)
            start += count
        return out.to(t.dtype)


def _as_bias_tuple(
    bias: torch.Tensor | tuple[torch.Tensor, ...] | None,
) -> tuple[torch.Tensor, ...]:
    if bias is None:
        return ()
    if isinstance(bias, torch.Tensor):
        return (bias,)
    if len(bias) > 2:
        raise ValueError(f"combine: bias takes at most two tensors, got {len(bias)}")
    return tuple(bias)
