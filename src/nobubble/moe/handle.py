"""What dispatch and combine return: the layout record of one dispatch and the two results.

A :class:`DispatchHandle` is everything combine, a cached dispatch and both backward passes
need to retrace one dispatch's layout without exchanging counts again; the results carry the
received (or combined) rows next to it. :class:`~nobubble.moe.buffer.Buffer` makes them;
:func:`exchange_plan` is its count and metadata exchange, which builds the handle.

Shape legend (the buffer's): ``N`` tokens on this rank, ``H`` hidden, ``K`` top-k, ``E``
experts, ``R`` ranks, ``L = E / R`` local experts, ``S`` rows this rank sends, ``M`` rows it
receives.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from nobubble.moe.layout import DispatchLayout, num_local_experts
from nobubble.moe.masking import MaskLedger, without_sources
from nobubble.moe.transport import Transport

__all__ = ["DispatchHandle", "DispatchResult", "CombineResult", "exchange_plan"]

_COUNT_HEADER = 3  # per-destination header in the count exchange: rows, topk, hidden


@dataclass(frozen=True, eq=False)
class DispatchHandle:
    """Everything combine and a cached dispatch need to retrace one dispatch's layout.

    Attributes:
        rank: this rank in the expert-parallel group.
        num_ranks: ``R``.
        num_experts: ``E`` (physical experts when replicas are used).
        num_tokens: ``N``, tokens this rank dispatched.
        is_token_in_rank: ``[N, R]`` bool, which ranks received each token.
        send_token_idx: ``[S]`` int64, the local token behind each sent row, grouped by
            destination rank in rank order, token order within.
        num_send_tokens_per_rank: ``R`` ints, rows sent to each rank (deduplicated tokens).
        num_recv_tokens_per_rank: ``R`` ints, rows received from each source rank.
        recv_src_idx: ``[M]`` int64, each received row's token index on its source rank.
        recv_topk_idx: ``[M, K]`` int64, local expert ids of each received row, -1 for slots
            owned by other ranks or empty.
        num_recv_tokens_per_expert: ``L`` ints, received (row, slot) pairs per local expert,
            not rounded to any alignment.
        topk_idx: ``[N, K]`` int64 global expert ids as dispatched (after masking moved or
            dropped slots), or None.
    """

    rank: int
    num_ranks: int
    num_experts: int
    num_tokens: int
    is_token_in_rank: torch.Tensor
    send_token_idx: torch.Tensor
    num_send_tokens_per_rank: tuple[int, ...]
    num_recv_tokens_per_rank: tuple[int, ...]
    recv_src_idx: torch.Tensor
    recv_topk_idx: torch.Tensor
    num_recv_tokens_per_expert: tuple[int, ...]
    topk_idx: torch.Tensor | None = None

    @property
    def num_recv_tokens(self) -> int:
        """``M``, rows this rank received."""
        return int(self.recv_src_idx.shape[0])

    @property
    def recv_rank_offsets(self) -> tuple[int, ...]:
        """``R + 1`` offsets: rows from source rank ``i`` are ``[offsets[i], offsets[i+1])``."""
        offsets = [0]
        for n in self.num_recv_tokens_per_rank:
            offsets.append(offsets[-1] + n)
        return tuple(offsets)


@dataclass(frozen=True, eq=False)
class DispatchResult:
    """What ``Buffer.dispatch`` returns.

    Attributes:
        recv_x: ``[M, H]`` received token rows, x's dtype.
        recv_topk_idx: ``[M, K]`` int64 local expert ids, -1 for other ranks' slots (None for a
            cached dispatch).
        recv_topk_weights: ``[M, K]`` weights, 0 on other ranks' slots (None without weights).
        num_recv_tokens_per_expert: ``L`` ints, rounded up to ``expert_alignment``.
        handle: the layout, for ``combine`` and cached dispatches.
    """

    recv_x: torch.Tensor
    recv_topk_idx: torch.Tensor | None
    recv_topk_weights: torch.Tensor | None
    num_recv_tokens_per_expert: list[int]
    handle: DispatchHandle


@dataclass(frozen=True, eq=False)
class CombineResult:
    """What ``Buffer.combine`` returns.

    Attributes:
        combined_x: ``[N, H]`` each token's rows from all ranks, summed (plus bias).
        combined_topk_weights: ``[N, K]`` the summed top-k weights (None when none were given).
    """

    combined_x: torch.Tensor
    combined_topk_weights: torch.Tensor | None


def exchange_plan(
    transport: Transport,
    mask: MaskLedger,
    layout: DispatchLayout,
    topk_idx: torch.Tensor,
    num_experts: int,
    *,
    hidden: int,
) -> DispatchHandle:
    """Exchange counts and routing metadata over ``transport``; no payload moves here.

    Args:
        transport: the buffer's transport (rank, world size, ``all_to_all``).
        mask: the buffer's :class:`~nobubble.moe.masking.MaskLedger`.
        layout: the layout of ``topk_idx [N, K]`` (int64); ``num_experts``: ``E``;
            ``hidden``: ``H`` of the payload (every rank must agree on K and H).

    With masking, the mask is read before and after each exchange: slots on ranks masked
    by then are taken out of the send side (the counts already sent to the survivors do
    not change), and rows from masked sources out of the receive side.
    """
    num_ranks, num_tokens, topk = transport.world_size, topk_idx.shape[0], topk_idx.shape[1]
    local = num_local_experts(num_experts, num_ranks)
    device = topk_idx.device
    avoid = mask.avoid  # re-routes / drops the slots of newly masked ranks
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
    recv_counts = transport.all_to_all(counts, ones, ones, kind="layout")  # (R, 3 + L)
    seen = masked
    topk_idx, layout, masked = avoid(topk_idx, layout, seen, num_experts)
    _check_peers_agree(recv_counts, topk, hidden, masked)
    num_send = tuple(int(v) for v in layout.num_tokens_per_rank.tolist())
    num_recv = [0 if i in masked else int(v) for i, v in enumerate(recv_counts[:, 0].tolist())]

    # Sent rows: destination-major, token order within (nonzero is row-major).
    pairs = layout.is_token_in_rank.to(device).t().nonzero()  # (S, 2): (rank, token)
    send_token_idx = pairs[:, 1].contiguous()  # (S,)
    meta = torch.cat([send_token_idx.view(-1, 1), topk_idx[send_token_idx]], dim=1)  # (S, 1+K)
    recv_meta = transport.all_to_all(meta, num_send, num_recv, kind="topk_idx")
    seen = masked
    topk_idx, layout, masked = avoid(topk_idx, layout, seen, num_experts)
    if masked != seen:  # masked during this exchange: out of the send and receive sides
        num_send = tuple(int(v) for v in layout.num_tokens_per_rank.tolist())
        send_token_idx = layout.is_token_in_rank.to(device).t().nonzero()[:, 1].contiguous()
        recv_meta, num_recv = without_sources(recv_meta, num_recv, masked - seen)
    recv_topk_idx, expert_counts = _local_slots(
        transport.rank, num_ranks, recv_meta[:, 1:], recv_counts, masked, local
    )
    return DispatchHandle(
        rank=transport.rank,
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
    rank: int,
    num_ranks: int,
    global_idx: torch.Tensor,
    recv_counts: torch.Tensor,
    masked: frozenset[int],
    local: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Received rows' ``[M, K]`` global expert ids -> ``(recv_topk_idx [M, K], counts [L])``:
    local ids (-1 for other ranks' slots) and received (row, slot) pairs per local expert,
    checked against the counts the ranks still present sent (``recv_counts [R, 3 + L]``)."""
    present = [i for i in range(num_ranks) if i not in masked]
    expert_counts = recv_counts[present, _COUNT_HEADER:].sum(dim=0)  # (L,)
    first = rank * local
    is_local = (global_idx >= first) & (global_idx < first + local)  # (M, K)
    recv_topk_idx = torch.where(is_local, global_idx - first, -1)  # (M, K)
    assert torch.equal(torch.bincount(recv_topk_idx[is_local], minlength=local), expert_counts), (
        "received expert counts disagree with the exchanged counts"
    )
    return recv_topk_idx, expert_counts


def _check_peers_agree(
    recv_counts: torch.Tensor, topk: int, hidden: int, masked: frozenset[int]
) -> None:
    """Every rank sees every rank's (K, H), so all of them raise together on a mismatch
    (masked ranks sent nothing and are left out)."""
    live = [i for i in range(recv_counts.shape[0]) if i not in masked]
    ks, hs = recv_counts[live, 1].tolist(), recv_counts[live, 2].tolist()
    if any(k != topk for k in ks) or any(h != hidden for h in hs):
        raise ValueError(
            f"dispatch: ranks disagree on shapes: topk per rank {ks}, hidden per rank {hs}; "
            "every rank must dispatch the same K and H"
        )
