"""Slow, obviously-correct dispatch and combine that the tests compare the fast paths against.

Shares no code with what it checks: only ``torch.distributed.all_gather`` on a process group.
:func:`reference_dispatch`: rank ``r`` keeps every token, from any rank, with at least one
expert in ``[r * L, (r + 1) * L)``, once, sorted by (source rank, source token).
:func:`reference_combine`: each rank adds up the rows labelled with its own rank one at a time,
in the order of the ranks that hold them (float32 for 16-bit rows), as the buffer does.

Shape legend: ``N`` tokens on this rank, ``H`` hidden (any trailing shape), ``K`` top-k,
``E`` experts, ``R`` ranks, ``L = E / R`` local experts, ``M`` rows this rank receives.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.distributed as dist

__all__ = ["ReferenceDispatch", "reference_dispatch", "reference_combine"]


@dataclass(frozen=True, eq=False)
class ReferenceDispatch:
    """The reference's answer in :class:`~nobubble.moe.handle.DispatchResult`'s layout.

    Attributes:
        recv_x: ``[M, H]`` x's dtype, rows sorted by (source rank, source token).
        recv_topk_idx: ``[M, K]`` int64 local expert ids, -1 on other ranks' and empty slots.
        recv_topk_weights: ``[M, K]`` the weights' dtype (float32 when none were given), 0 on
            other ranks' and empty slots.
        num_recv_tokens_per_expert: ``L`` ints, received (row, slot) pairs per local expert.
        recv_src_rank, recv_src_token: ``[M]`` int64, where each row came from.
    """

    recv_x: torch.Tensor
    recv_topk_idx: torch.Tensor
    recv_topk_weights: torch.Tensor
    num_recv_tokens_per_expert: list[int]
    recv_src_rank: torch.Tensor
    recv_src_token: torch.Tensor


def _gather_rows(t: torch.Tensor, group: dist.ProcessGroup | None) -> list[torch.Tensor]:
    """Every rank's ``[n_r, *]`` tensor, on every rank: ``R`` tensors in rank order.

    The row counts are gathered first, then every tensor padded to the longest (at least one
    row, so that no rank gathers an empty tensor) and gathered as bytes, so any dtype
    crosses any backend unchanged; the padding is cut off again.
    """
    world = dist.get_world_size(group)
    count = torch.tensor([t.shape[0]], dtype=torch.int64, device=t.device)
    counts = [torch.zeros_like(count) for _ in range(world)]
    dist.all_gather(counts, count, group=group)
    num_rows = [int(c.item()) for c in counts]
    longest = max(1, *num_rows)
    row_shape = tuple(t.shape[1:])
    flat = t.detach().contiguous().reshape(t.shape[0], math.prod(row_shape))  # (n, F)
    as_bytes = flat.view(torch.uint8) if flat.dtype != torch.uint8 else flat  # (n, F * bytes)
    padded = torch.zeros((longest, as_bytes.shape[1]), dtype=torch.uint8, device=t.device)
    padded[: t.shape[0]] = as_bytes
    gathered = [torch.empty_like(padded) for _ in range(world)]
    dist.all_gather(gathered, padded, group=group)
    out = []
    for r in range(world):
        rows = gathered[r][: num_rows[r]].view(t.dtype)  # (n_r, F)
        out.append(rows.reshape(num_rows[r], *row_shape))
    return out


def reference_dispatch(
    x: torch.Tensor,
    topk_idx: torch.Tensor,
    topk_weights: torch.Tensor | None,
    num_experts: int,
    group: dist.ProcessGroup | None = None,
) -> ReferenceDispatch:
    """Gather every rank's tokens; keep, once, each one with an expert on this rank.

    Every rank of ``group`` must call it together (six ``all_gather`` calls each).

    Args:
        x: ``[N, H]`` token rows, any dtype.
        topk_idx: ``[N, K]`` integer global expert ids, -1 = no expert.
        topk_weights: ``[N, K]`` floating weights, or None.
        num_experts: ``E``, a multiple of the group size; rank ``r`` owns experts
            ``[r * L, (r + 1) * L)``.
        group: the expert-parallel process group (None = the default group).
    Returns:
        :class:`ReferenceDispatch`, on x's device.
    """
    num_ranks, rank = dist.get_world_size(group), dist.get_rank(group)
    if num_experts < 1 or num_experts % num_ranks != 0:
        raise ValueError(
            f"reference_dispatch: num_experts={num_experts} must be a positive multiple of the "
            f"group size {num_ranks}"
        )
    if topk_idx.dim() != 2 or topk_idx.shape[0] != x.shape[0]:
        raise ValueError(
            f"reference_dispatch: topk_idx.shape={tuple(topk_idx.shape)} must be "
            f"[{x.shape[0]}, K] (one row per token of x)"
        )
    local = num_experts // num_ranks
    weight_dtype = topk_weights.dtype if topk_weights is not None else torch.float32
    if topk_weights is None:
        topk_weights = torch.zeros(topk_idx.shape, dtype=weight_dtype, device=x.device)
    all_x = _gather_rows(x, group)  # R x (N_r, H)
    all_idx = _gather_rows(topk_idx.long(), group)  # R x (N_r, K)
    all_w = _gather_rows(topk_weights, group)  # R x (N_r, K)

    kept = _rows_with_local_experts(all_idx, first=rank * local, num_local=local)
    topk = topk_idx.shape[1]
    recv_topk_idx = torch.full((len(kept), topk), -1, dtype=torch.int64, device=x.device)
    recv_topk_weights = torch.zeros((len(kept), topk), dtype=weight_dtype, device=x.device)
    counts = [0] * local
    for m, (src, token, local_ids) in enumerate(kept):
        for k, expert in enumerate(local_ids):
            if expert >= 0:
                recv_topk_idx[m, k] = expert
                recv_topk_weights[m, k] = all_w[src][token, k]
                counts[expert] += 1
    rows = [all_x[src][token] for src, token, _ in kept]
    return ReferenceDispatch(
        recv_x=torch.stack(rows) if rows else x.new_empty((0, *x.shape[1:])),
        recv_topk_idx=recv_topk_idx,
        recv_topk_weights=recv_topk_weights,
        num_recv_tokens_per_expert=counts,
        recv_src_rank=torch.tensor([s for s, _, _ in kept], dtype=torch.int64, device=x.device),
        recv_src_token=torch.tensor([t for _, t, _ in kept], dtype=torch.int64, device=x.device),
    )


def _rows_with_local_experts(
    all_idx: list[torch.Tensor], *, first: int, num_local: int
) -> list[tuple[int, int, list[int]]]:
    """``(source rank, source token, local expert id per slot or -1)`` for every token, of any
    rank, with a slot in ``[first, first + num_local)``; source rank order, then token order
    (the buffer's layout). ``all_idx``: ``R`` tensors ``[N_r, K]`` of global expert ids."""
    kept = []
    for src, idx in enumerate(all_idx):
        for token, experts in enumerate(idx.tolist()):
            local_ids = [e - first if first <= e < first + num_local else -1 for e in experts]
            if any(e >= 0 for e in local_ids):
                kept.append((src, token, local_ids))
    return kept


def reference_combine(
    x: torch.Tensor,
    recv_src_rank: torch.Tensor,
    recv_src_token: torch.Tensor,
    num_tokens: int,
    group: dist.ProcessGroup | None = None,
) -> torch.Tensor:
    """Gather every rank's rows with their labels; add up, one by one, the rows of this rank.

    Every rank of ``group`` must call it together (six ``all_gather`` calls each).

    Args:
        x: ``[M, H]`` rows (any trailing shape), e.g. expert outputs in
            :func:`reference_dispatch`'s order; the order does not matter, the labels do.
        recv_src_rank, recv_src_token: ``[M]`` integer, the (rank, token) each row belongs to.
        num_tokens: ``N`` of this rank.
        group: the expert-parallel process group (None = the default group).
    Returns:
        ``[N, H]`` in x's dtype: per token, the sum of its rows in the order of the ranks that
        hold them (row order within a rank), accumulated in float32 for 16-bit dtypes; tokens
        without rows are 0.
    """
    if recv_src_rank.shape != (x.shape[0],) or recv_src_token.shape != (x.shape[0],):
        raise ValueError(
            f"reference_combine: recv_src_rank / recv_src_token must be [{x.shape[0]}] (one per "
            f"row of x), got {tuple(recv_src_rank.shape)} / {tuple(recv_src_token.shape)}"
        )
    num_ranks, rank = dist.get_world_size(group), dist.get_rank(group)
    all_x = _gather_rows(x, group)  # R x (M_r, H)
    all_src_rank = _gather_rows(recv_src_rank.long(), group)  # R x (M_r,)
    all_src_token = _gather_rows(recv_src_token.long(), group)  # R x (M_r,)
    widen = x.is_floating_point() and x.element_size() < 4
    acc_dtype = torch.float32 if widen else x.dtype
    out = torch.zeros((num_tokens, *x.shape[1:]), dtype=acc_dtype, device=x.device)
    for holder in range(num_ranks):  # the rank that computed the rows, in rank order
        owners, tokens = all_src_rank[holder].tolist(), all_src_token[holder].tolist()
        for m in range(len(owners)):
            if owners[m] == rank:
                t = tokens[m]
                out[t] = out[t] + all_x[holder][m].to(acc_dtype)
    return out.to(x.dtype)
