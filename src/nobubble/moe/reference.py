"""Slow, obviously-correct dispatch and combine that the tests compare :class:`Buffer` against.

The reference does what a MoE layer does without DeepEP: it sends one message per
(token, expert) pair through one ``all_to_all_single`` (so a token with three experts on one
rank travels three times), then deduplicates on the receiver by (source rank, source token).
Combine sends each received row back to its source rank and adds the rows up one at a time,
in source-rank order. :func:`pair_dispatch` / :func:`pair_combine` are also the "plain
all-to-all" baseline of ``nobubble ep bench``.

Shape legend: ``N`` tokens, ``H`` hidden, ``K`` top-k, ``P`` (token, expert) pairs sent,
``Q`` pairs received, ``M`` distinct (source rank, token) rows received, ``L`` local experts.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from nobubble.moe.transport import Transport

__all__ = [
    "PairDispatch",
    "ReferenceDispatch",
    "pair_dispatch",
    "pair_combine",
    "reference_dispatch",
    "reference_combine",
]


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
    """Send ``x[n]`` once for every valid slot ``topk_idx[n, k]`` to the expert's rank."""
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
    """Return every pair's row to its token's rank and sum per token (float32 accumulation)."""
    back = transport.all_to_all(
        pair_rows, pairs.num_recv_per_rank, pairs.num_send_per_rank, kind="x"
    )  # (P, H)
    acc = torch.zeros((num_tokens, *pair_rows.shape[1:]), dtype=torch.float32, device=back.device)
    acc.index_add_(0, pairs.send_token, back.float())
    return acc.to(pair_rows.dtype)


@dataclass(frozen=True, eq=False)
class ReferenceDispatch:
    """The reference's answer in :class:`~nobubble.moe.buffer.DispatchResult`'s layout.

    Attributes:
        recv_x: ``[M, H]`` rows sorted by (source rank, source token).
        recv_topk_idx: ``[M, K]`` local expert ids, -1 elsewhere.
        recv_topk_weights: ``[M, K]`` float32, 0 elsewhere.
        num_recv_tokens_per_expert: ``L`` ints.
        recv_src_rank, recv_src_token: ``[M]`` int64, where each row came from.
    """

    recv_x: torch.Tensor
    recv_topk_idx: torch.Tensor
    recv_topk_weights: torch.Tensor
    num_recv_tokens_per_expert: list[int]
    recv_src_rank: torch.Tensor
    recv_src_token: torch.Tensor


def reference_dispatch(
    x: torch.Tensor,
    topk_idx: torch.Tensor,
    topk_weights: torch.Tensor | None,
    num_experts: int,
    transport: Transport,
) -> ReferenceDispatch:
    """Per-pair all-to-all, then keep one row per distinct (source rank, source token)."""
    pairs = pair_dispatch(x, topk_idx, topk_weights, num_experts, transport)
    local = num_experts // transport.world_size
    first = transport.rank * local
    topk = topk_idx.shape[1]
    rows: dict[tuple[int, int], int] = {}  # (src rank, src token) -> pair index of first copy
    slots: dict[tuple[int, int], list[tuple[int, int, float]]] = {}
    for q in range(pairs.recv_rows.shape[0]):
        key = (int(pairs.recv_src_rank[q]), int(pairs.recv_src_token[q]))
        rows.setdefault(key, q)
        slots.setdefault(key, []).append(
            (
                int(pairs.recv_slot[q]),
                int(pairs.recv_expert[q]) - first,
                float(pairs.recv_topk_weights[q]),
            )
        )
    keys = sorted(rows)
    num_rows = len(keys)
    recv_topk_idx = torch.full((num_rows, topk), -1, dtype=torch.int64, device=x.device)
    recv_topk_weights = torch.zeros((num_rows, topk), dtype=torch.float32, device=x.device)
    counts = [0] * local
    for m, key in enumerate(keys):
        for slot, expert, weight in slots[key]:
            recv_topk_idx[m, slot] = expert
            recv_topk_weights[m, slot] = weight
            counts[expert] += 1
    take = torch.tensor([rows[k] for k in keys], dtype=torch.int64, device=x.device)
    return ReferenceDispatch(
        recv_x=pairs.recv_rows[take],
        recv_topk_idx=recv_topk_idx,
        recv_topk_weights=recv_topk_weights,
        num_recv_tokens_per_expert=counts,
        recv_src_rank=torch.tensor([k[0] for k in keys], dtype=torch.int64, device=x.device),
        recv_src_token=torch.tensor([k[1] for k in keys], dtype=torch.int64, device=x.device),
    )


def reference_combine(
    x: torch.Tensor,
    recv_src_rank: torch.Tensor,
    recv_src_token: torch.Tensor,
    num_tokens: int,
    transport: Transport,
) -> torch.Tensor:
    """Send row ``m`` back to ``recv_src_rank[m]``; each rank adds its rows one by one.

    Args:
        x: ``[M, H]`` rows in :func:`reference_dispatch`'s order (sorted by source rank).
        num_tokens: ``N`` of this rank.
    Returns:
        ``[N, H]`` in x's dtype; sums run in float32 for 16-bit dtypes, in source-rank order.
    """
    num_ranks = transport.world_size
    send_counts = torch.bincount(recv_src_rank, minlength=num_ranks).view(num_ranks, 1)
    ones = [1] * num_ranks
    num_recv = transport.all_to_all(send_counts, ones, ones, kind="ref_layout").view(-1).tolist()
    num_send = send_counts.view(-1).tolist()
    back = transport.all_to_all(x, num_send, num_recv, kind="ref_x")
    back_token = transport.all_to_all(recv_src_token, num_send, num_recv, kind="ref_meta")
    acc_dtype = torch.float32 if x.element_size() < 4 and x.is_floating_point() else x.dtype
    out = torch.zeros((num_tokens, *x.shape[1:]), dtype=acc_dtype, device=x.device)
    for i in range(back.shape[0]):  # rows arrive grouped by source rank, in rank order
        t = int(back_token[i])
        out[t] = out[t] + back[i].to(acc_dtype)
    return out.to(x.dtype)
