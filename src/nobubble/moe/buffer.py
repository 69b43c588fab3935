"""DeepEP-style expert-parallel dispatch and combine: one :class:`Buffer` for every transport and mode.

``dispatch`` sends each token once to every rank holding one of its top-k experts; ``combine``
sums the rows that come back; ``low_latency_dispatch`` / ``low_latency_combine`` are the
decoding mode (:mod:`nobubble.moe.fastpath.low_latency`). Received rows are grouped by source
rank, then source token; the :class:`~nobubble.moe.handle.DispatchHandle` records that layout
for reuse and for the backward passes. The row movers are chosen once from the transport's
declared :class:`~nobubble.moe.transport.Capabilities`: hierarchical with ``topology``, fused
peer writes, or the collective ``all_to_all`` (always while masking failed ranks). Every path
returns the same rows in the same order (hierarchical combine sums inside a node first).

Lifecycle: ``Buffer(...)`` (a collective over ``group``) -> dispatch / combine ... -> ``close()``
(or a ``with`` block); later calls raise ``ValueError``. A silent peer raises
:class:`~nobubble.moe.transport.PeerFailure` naming the phase (``layout``, ``dispatch``,
``combine``) and the ranks; a masking transport re-routes or drops their slots
(:meth:`Buffer.set_replicas`, :meth:`Buffer.masking_stats`). See ``docs/moe/dispatch.md``.

Shape legend: ``N`` tokens on this rank, ``H`` hidden, ``K`` top-k, ``E`` experts, ``R`` ranks,
``L = E / R`` local experts, ``S`` rows this rank sends, ``M`` rows it receives,
``T = num_max_dispatch_tokens_per_rank``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from types import TracebackType
from typing import TYPE_CHECKING, TypeVar, cast

import torch

from nobubble.moe.autograd import CombineFunction, DispatchFunction
from nobubble.moe.fastpath.hierarchical import HierarchicalRows, Topology
from nobubble.moe.fastpath.low_latency import LowLatencyDispatch, LowLatencyHandle, LowLatencyMode
from nobubble.moe.fastpath.shm_rows import ShmRows
from nobubble.moe.fastpath.shm_transport import make_transport
from nobubble.moe.handle import CombineResult, DispatchHandle, DispatchResult, exchange_plan
from nobubble.moe.layout import (
    DispatchLayout,
    check_topk_idx,
    get_dispatch_layout,
    num_local_experts,
)
from nobubble.moe.masking import MaskingStats, MaskLedger
from nobubble.moe.rows import CollectiveRows, RowMover
from nobubble.moe.transport import (
    PeerFailure,
    PeerWrites,
    TorchDistTransport,
    Transport,
    capabilities_of,
)

if TYPE_CHECKING:
    import torch.distributed as dist

__all__ = ["Buffer", "DispatchHandle", "DispatchResult", "CombineResult", "Topology"]

_T = TypeVar("_T")


class Buffer:
    """Expert-parallel communication buffer for one process group (DeepEP's ``Buffer``).

    Building one is a collective: every rank of ``group`` calls it with the same arguments.

    Args:
        group: the expert-parallel ``torch.distributed`` group (``None`` = default group);
            unused when ``transport`` is a :class:`~nobubble.moe.transport.Transport`.
        num_experts: default ``E`` for calls that do not pass it (a multiple of the size).
        transport: a kind - ``"auto"`` (shared memory for gloo on one CPU host, else
            ``torch.distributed`` collectives), ``"shm"`` or ``"dist"`` - or a transport
            object (e.g. ``ShmTransport(group, mask_failed_ranks=True)``); the buffer reads
            its declared capabilities to choose its fast paths.
        topology: :class:`Topology` of the group's nodes for hierarchical routing (rows cross
            nodes once per (token, node)); then ``transport`` is the kind used inside a node,
            and counts and the low-latency mode go over ``torch.distributed``.
        timeout_s: the longest any wait for a peer may take (transports built here).
        combine_chunk_bytes: size of the float32 scratch in which the collective path's
            combine widens 16-bit rows on CPU (cache-sized chunks are about twice as fast).
        recycle_outputs: with peer writes, keep up to this many large output buffers for
            reuse once the caller drops them (0: every output is a fresh allocation).
        fused_kernels: with peer writes, reduce combine with the compiled C kernel when it is
            available (``False``: always the torch path; the results are identical).

    Attributes:
        transport: the transport (counts, statistics; the payload too unless ``topology``).
        path: the row movers chosen: ``"peer_writes"``, ``"collective"`` or ``"hierarchical"``.
        hierarchical: with ``topology``, the hierarchical row movers (rail ``inter`` and node
            ``intra`` transports, per-handle ``plan``); else None.
    """

    def __init__(
        self,
        group: dist.ProcessGroup | None = None,
        num_experts: int | None = None,
        *,
        transport: str | Transport = "auto",
        topology: Topology | None = None,
        timeout_s: float = 120.0,
        combine_chunk_bytes: int = 4 << 20,
        recycle_outputs: int = 4,
        fused_kernels: bool = True,
    ) -> None:
        if combine_chunk_bytes < 1:
            raise ValueError(f"Buffer: combine_chunk_bytes={combine_chunk_bytes} must be >= 1")
        if (
            isinstance(recycle_outputs, bool)
            or not isinstance(recycle_outputs, int)
            or (recycle_outputs < 0)
        ):
            raise ValueError(
                f"Buffer: recycle_outputs={recycle_outputs!r} must be an int >= 0 (0 turns "
                "output reuse off)"
            )
        self.combine_chunk_bytes = combine_chunk_bytes
        hierarchical = None
        if topology is not None:
            if hasattr(transport, "all_to_all"):
                raise ValueError(
                    "Buffer: with topology=, pass transport as a kind ('auto', 'shm' or "
                    "'dist') for the intra-node step; the buffer builds the node and rail groups"
                )
            self.transport: Transport = TorchDistTransport(group, timeout_s=timeout_s)
            hierarchical = HierarchicalRows(group, topology, intra=transport, timeout_s=timeout_s)
        elif hasattr(transport, "all_to_all"):  # a transport object
            self.transport = cast(Transport, transport)
        else:
            self.transport = make_transport(transport, group, timeout_s=timeout_s)
        self.topology = topology
        self.rank = self.transport.rank
        self.num_ranks = self.transport.world_size
        if num_experts is not None:
            num_local_experts(num_experts, self.num_ranks)
        self.num_experts = num_experts
        self._mask = MaskLedger(self.rank, self.transport)
        self.masks_failed_ranks = self._mask.enabled
        self.hierarchical = hierarchical
        self.path = "collective"
        self._rows: RowMover = self._choose_rows(hierarchical, recycle_outputs, fused_kernels)
        self._low_latency: dict[int, LowLatencyMode] = {}  # per E
        self._closed = False

    def _choose_rows(
        self, hierarchical: HierarchicalRows | None, recycle_outputs: int, fused_kernels: bool
    ) -> RowMover:
        """The row movers for this transport: hierarchical, fused peer writes (not while
        masking failed ranks: only the collective path goes on without them), or collective;
        ``self.path`` names the choice (``"hierarchical"``, ``"peer_writes"``, ``"collective"``)."""
        if hierarchical is not None:
            self.path = "hierarchical"
            return hierarchical
        caps = capabilities_of(self.transport)
        if caps.peer_writes and not self.masks_failed_ranks:
            self.path = "peer_writes"
            return ShmRows(
                cast(PeerWrites, self.transport),
                recycle_outputs=recycle_outputs,
                fused_kernels=fused_kernels,
            )
        return CollectiveRows(self.transport, self._mask, self.combine_chunk_bytes)

    # -- lifecycle --------------------------------------------------------------------------
    def close(self) -> None:
        """Release what the buffer's transports hold (shared memory: names and mappings).

        Idempotent. A transport passed in by the caller is closed too (the buffer owns it
        from then on). Call it on every rank, after the last dispatch / combine.
        """
        if self._closed:
            return
        self._closed = True
        self.transport.close()
        if self.hierarchical is not None:
            self.hierarchical.close()

    def __enter__(self) -> Buffer:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def _check_usable(self, op: str) -> None:
        if self._closed:
            raise ValueError(f"{op}: the Buffer is closed; build a new one")
        for mode in self._low_latency.values():
            mode.check_idle(op)

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
        self._check_usable("dispatch")
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
        handle = exchange_plan(
            self.transport, self._mask, layout, topk_idx.long(), num_experts, hidden=x.shape[1]
        )
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
        self._check_usable("combine")
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
        return self._in_phase("dispatch", lambda: self._rows.dispatch_rows(t, handle, kind=kind))

    def combine_rows(self, t: torch.Tensor, handle: DispatchHandle, *, kind: str) -> torch.Tensor:
        """``[M, *]`` -> ``[N, *]``: return rows to their source ranks and sum them per token,
        source ranks in rank order, in float32 for 16-bit inputs (deterministic everywhere)."""
        return self._in_phase("combine", lambda: self._rows.combine_rows(t, handle, kind=kind))

    # -- low-latency mode -------------------------------------------------------------------
    def low_latency_dispatch(
        self,
        x: torch.Tensor,
        topk_idx: torch.Tensor,
        *,
        num_max_dispatch_tokens_per_rank: int,
        num_experts: int | None = None,
        use_fp8: bool = False,
        return_recv_hook: bool = False,
    ) -> LowLatencyDispatch:
        """Send one row per (token, expert) pair into the owners' fixed-capacity slots.

        Args:
            x: ``[N, H]`` floating, ``N <= T``.
            topk_idx: ``[N, K]`` int64 expert ids, -1 = none.
            num_max_dispatch_tokens_per_rank: ``T``, the most tokens any rank dispatches at
                once (every rank passes the same).
            num_experts: ``E`` (default: the buffer's).
            use_fp8: send e4m3 values with per-128-channel scales, dequantise on receipt.
            return_recv_hook: only send now; receive when the returned hook is called (no
                other call on this buffer in between).
        Returns:
            :class:`~nobubble.moe.fastpath.low_latency.LowLatencyDispatch`: ``recv_x
            [L, R * T, H]`` expert-major (valid until the next low-latency dispatch),
            ``recv_count [L]``, the handle and the hook.
        """
        self._check_usable("low_latency_dispatch")
        return self._low_latency_mode(self._num_experts(num_experts)).dispatch(
            x,
            topk_idx,
            num_max_dispatch_tokens_per_rank=num_max_dispatch_tokens_per_rank,
            use_fp8=use_fp8,
            return_recv_hook=return_recv_hook,
        )

    def low_latency_combine(
        self,
        x: torch.Tensor,
        topk_idx: torch.Tensor,
        topk_weights: torch.Tensor,
        handle: LowLatencyHandle,
    ) -> torch.Tensor:
        """``sum_k topk_weights[n, k] * x_out(n, k)`` for this rank's tokens.

        Args:
            x: ``[L, R * T, H]`` expert outputs in ``recv_x``'s layout.
            topk_idx: ``[N, K]`` the dispatch's routing (slots with -1 contribute nothing).
            topk_weights: ``[N, K]`` floating.
            handle: the dispatch's handle (after its receive completed).
        Returns:
            ``[N, H]`` in x's dtype; float32 products and sums, slots added in order k = 0..K-1.
        """
        self._check_usable("low_latency_combine")  # no combine while a receive is pending
        num_experts = getattr(handle, "num_experts", None)
        if num_experts is None:
            raise ValueError(
                f"low_latency_combine: handle is {type(handle).__name__}; pass the handle of a "
                "low_latency_dispatch result"
            )
        return self._low_latency_mode(num_experts).combine(x, topk_idx, topk_weights, handle)

    def _low_latency_mode(self, num_experts: int) -> LowLatencyMode:
        if self.masks_failed_ranks:
            raise ValueError(
                "low-latency mode does not mask failed ranks; use dispatch/combine with a "
                "transport that masks them, or a transport without masking"
            )
        if num_experts not in self._low_latency:
            self._low_latency[num_experts] = LowLatencyMode(self.transport, num_experts)
        return self._low_latency[num_experts]


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
