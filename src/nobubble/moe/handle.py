"""What dispatch and combine return: the layout record of one dispatch and the two results.

A :class:`DispatchHandle` is everything combine, a cached dispatch and both backward passes
need to retrace one dispatch's layout without exchanging counts again; the results carry the
received (or combined) rows next to it. :class:`~nobubble.moe.buffer.Buffer` makes them.

Shape legend (the buffer's): ``N`` tokens on this rank, ``H`` hidden, ``K`` top-k, ``E``
experts, ``R`` ranks, ``L = E / R`` local experts, ``S`` rows this rank sends, ``M`` rows it
receives.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["DispatchHandle", "DispatchResult", "CombineResult"]


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
