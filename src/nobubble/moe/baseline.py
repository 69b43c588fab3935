"""The plain all-to-all baseline: one message per (token, expert) pair, through a Transport.

One copy of a token per valid top-k slot goes through one ``all_to_all``, and the copies are
summed back on the token's rank; ``nobubble ep bench`` and the MoE demo time
:class:`~nobubble.moe.buffer.Buffer` against it on the same transport (so it is not the tests'
reference, ``tests/moe/reference.py``).

Shape legend: ``N`` tokens, ``H`` hidden, ``K`` top-k, ``P`` (token, expert) pairs sent,
``Q`` pairs received, ``R`` ranks.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from nobubble.moe.transport import Transport

__all__ = ["PairDispatch", "pair_dispatch", "pair_combine"]


@dataclass(frozen=True, eq=False)
class PairDispatch:
    """One row per (token, expert) pair, as a plain all-to-all delivers them.

    Attributes:
        recv_rows: ``[Q, H]`` one copy of the token per pair, grouped by source rank.
        recv_src_rank, recv_src_token, recv_slot, recv_expert: ``[Q]`` int64 each: where the
            pair came from, which top-k slot, which (global) expert.
        recv_topk_weights: ``[Q]`` the pair's weight (zeros when none were given).
        send_token: ``[P]`` int64, the local token of each sent pair (send order).
        num_send_per_rank, num_recv_per_rank: ``R`` ints, pairs sent to / received from each rank.
    """

    recv_rows: torch.Tensor
    recv_src_rank: torch.Tensor
    recv_src_token: torch.Tensor
    recv_slot: torch.Tensor
    recv_expert: torch.Tensor
    recv_topk_weights: torch.Tensor
    send_token: torch.Tensor
    num_send_per_rank: list[int]
    num_recv_per_rank: list[int]


def pair_dispatch(
    x: torch.Tensor,
    topk_idx: torch.Tensor,
    topk_weights: torch.Tensor | None,
    num_experts: int,
    transport: Transport,
) -> PairDispatch:
    """Send ``x[n]`` once for every valid slot ``topk_idx[n, k]`` to the expert's rank.

    Args:
        x: ``[N, H]`` token rows, any dtype.
        topk_idx: ``[N, K]`` int64 global expert ids, -1 = no expert.
        topk_weights: ``[N, K]`` floating, or None (the pairs then carry zeros).
        num_experts: ``E``, a multiple of the transport's world size.
        transport: moves the pairs.
    """
    num_ranks = transport.world_size
    experts_per_rank = num_experts // num_ranks
    num_tokens, topk = topk_idx.shape
    device = x.device
    token = torch.arange(num_tokens, device=device).repeat_interleave(topk)  # (N*K,)
    slot = torch.arange(topk, device=device).repeat(num_tokens)  # (N*K,)
    expert = topk_idx.reshape(-1).long()  # (N*K,)
    if topk_weights is None:
        topk_weights = torch.zeros(num_tokens, topk, device=device)
    weight = topk_weights.reshape(-1).float()
    valid = expert >= 0
    token, slot, expert, weight = token[valid], slot[valid], expert[valid], weight[valid]
    dest = expert // experts_per_rank
    order = torch.argsort(dest, stable=True)  # pairs grouped by destination, token order within
    token, slot, expert, weight, dest = (t[order] for t in (token, slot, expert, weight, dest))

    send_counts = torch.bincount(dest, minlength=num_ranks).view(num_ranks, 1)  # (R, 1)
    ones = [1] * num_ranks
    num_recv = transport.all_to_all(send_counts, ones, ones, kind="pair_layout").view(-1).tolist()
    num_send = send_counts.view(-1).tolist()
    src_rank = torch.full_like(token, transport.rank)
    meta = torch.stack([src_rank, token, slot, expert], dim=1)  # (P, 4)
    recv_meta = transport.all_to_all(meta, num_send, num_recv, kind="pair_meta")  # (Q, 4)
    recv_weight = transport.all_to_all(weight, num_send, num_recv, kind="pair_weights")  # (Q,)
    recv_rows = transport.all_to_all(x[token], num_send, num_recv, kind="x")  # (Q, H)
    return PairDispatch(
        recv_rows=recv_rows,
        recv_src_rank=recv_meta[:, 0],
        recv_src_token=recv_meta[:, 1],
        recv_slot=recv_meta[:, 2],
        recv_expert=recv_meta[:, 3],
        recv_topk_weights=recv_weight,
        send_token=token,
        num_send_per_rank=num_send,
        num_recv_per_rank=num_recv,
    )


def pair_combine(
    pair_rows: torch.Tensor, pairs: PairDispatch, num_tokens: int, transport: Transport
) -> torch.Tensor:
    """Return every pair's row to its token's rank and sum per token (float32 accumulation).

    Args:
        pair_rows: ``[Q, H]`` one row per received pair, in :func:`pair_dispatch`'s order.
        pairs: that dispatch's record.
        num_tokens: ``N`` of this rank.
    Returns:
        ``[N, H]`` in ``pair_rows``' dtype.
    """
    back = transport.all_to_all(
        pair_rows, pairs.num_recv_per_rank, pairs.num_send_per_rank, kind="x"
    )  # (P, H)
    acc = torch.zeros((num_tokens, *pair_rows.shape[1:]), dtype=torch.float32, device=back.device)
    acc.index_add_(0, pairs.send_token, back.float())
    return acc.to(pair_rows.dtype)
