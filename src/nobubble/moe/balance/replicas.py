"""Replica routing: send each (token, logical expert) pair to one physical replica.

Every top-k slot is rewritten from a logical expert ``e`` to one of its ``logcnt[e]``
replicas ``log2phy[e, :logcnt[e]]`` (same weights: only where the work runs changes).
Strategies: ``"token_hash"`` (a fixed hash of (global token id, expert); stateless),
``"round_robin"`` (the i-th pair to ``e`` goes to replica ``(start[e] + i) % cnt``, ``start``
carried across calls), ``"least_loaded"`` (the replica with the least load so far, starting
from the caller's estimate).

Shape legend: ``N`` tokens, ``K`` top-k, ``E`` logical experts, ``R`` physical experts,
``C`` most replicas of one expert.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from typing import Literal

import torch

__all__ = ["ReplicaStrategy", "STRATEGIES", "route_to_replicas", "ReplicaRouter"]

ReplicaStrategy = Literal["token_hash", "round_robin", "least_loaded"]
STRATEGIES: tuple[str, ...] = ("token_hash", "round_robin", "least_loaded")

_HASH_MUL = 0x9E3779B1  # Knuth's multiplicative hash (golden ratio * 2^32)
_HASH_EXPERT = 0x85EBCA77


def _check(topk_idx: torch.Tensor, log2phy: torch.Tensor, logcnt: torch.Tensor) -> None:
    if topk_idx.dim() != 2 or topk_idx.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"topk_idx must be an integer (N, K) tensor, got {topk_idx.dtype} "
                         f"{tuple(topk_idx.shape)}")  # fmt: skip
    num_log = logcnt.shape[0]
    if log2phy.dim() != 2 or log2phy.shape[0] != num_log:
        raise ValueError(f"log2phy must be (E={num_log}, C), got {tuple(log2phy.shape)}")
    if topk_idx.numel() and (topk_idx.max() >= num_log or topk_idx.min() < -1):
        raise ValueError(f"topk_idx holds ids outside [-1, {num_log}): use logical expert ids")
    if (logcnt < 1).any():
        raise ValueError("logcnt: every logical expert needs at least one replica")


def _hash_choice(
    flat_idx: torch.Tensor, token_ids: torch.Tensor, counts: torch.Tensor
) -> torch.Tensor:
    """Replica rank per pair from a 32-bit multiplicative hash of (token id, expert)."""
    h = (token_ids * _HASH_MUL + flat_idx * _HASH_EXPERT) & 0xFFFFFFFF
    h = (h ^ (h >> 16)) * 0x45D9F3B & 0xFFFFFFFF
    return (h ^ (h >> 16)) % counts


def _round_robin_choice(
    flat_idx: torch.Tensor, counts: torch.Tensor, start: torch.Tensor
) -> torch.Tensor:
    """The i-th pair (row-major order) of expert e gets replica ``(start[e] + i) % cnt[e]``."""
    order = torch.sort(flat_idx, stable=True).indices  # pairs grouped by expert, in order
    sorted_idx = flat_idx[order]
    first = torch.searchsorted(sorted_idx, sorted_idx, side="left")  # group start per pair
    occurrence = torch.empty_like(flat_idx)
    occurrence[order] = torch.arange(flat_idx.numel(), device=flat_idx.device) - first
    return (start[flat_idx] + occurrence) % counts


def _least_loaded_choice(
    flat_idx: torch.Tensor,
    log2phy: torch.Tensor,
    counts: torch.Tensor,
    replica_load: torch.Tensor,
) -> torch.Tensor:
    """Greedy: each pair in order to the replica of its expert with the least load so far."""
    choice = torch.zeros_like(flat_idx)
    idx_list = flat_idx.tolist()
    heaps: dict[int, list[tuple[float, int]]] = {}
    for pos, e in enumerate(idx_list):
        cnt = int(counts[pos])
        if cnt == 1:
            continue
        heap = heaps.get(e)
        if heap is None:
            heap = [(float(replica_load[int(log2phy[e, r])]), r) for r in range(cnt)]
            heapq.heapify(heap)
            heaps[e] = heap
        load, r = heapq.heappop(heap)
        choice[pos] = r
        heapq.heappush(heap, (load + 1.0, r))
    return choice


def route_to_replicas(
    topk_idx: torch.Tensor,
    log2phy: torch.Tensor,
    logcnt: torch.Tensor,
    *,
    strategy: ReplicaStrategy = "round_robin",
    token_ids: torch.Tensor | None = None,
    round_robin_start: torch.Tensor | None = None,
    replica_load: torch.Tensor | None = None,
) -> torch.Tensor:
    """Map logical ``topk_idx (N, K)`` to physical ids ``(N, K)`` int64; -1 stays -1.

    Args:
        topk_idx: (N, K) int logical expert ids, -1 = no expert.
        log2phy: (E, C) int64 physical ids of each expert's replicas, -1 padded (one layer of
            :class:`~nobubble.moe.balance.eplb.ExpertPlacement`'s ``log2phy``).
        logcnt: (E,) int64 replicas per expert.
        strategy: "token_hash", "round_robin" or "least_loaded".
        token_ids: (N,) int64 global token ids for "token_hash" (default ``arange(N)``; give
            each rank its own range so two ranks' token 0 do not collide).
        round_robin_start: (E,) int64 first replica rank per expert for "round_robin".
        replica_load: (R,) float prior load per physical expert for "least_loaded".
    """
    if strategy not in STRATEGIES:
        raise ValueError(f"strategy={strategy!r}: use one of {STRATEGIES}")
    _check(topk_idx, log2phy, logcnt)
    device = topk_idx.device
    log2phy, logcnt = log2phy.to(device), logcnt.to(device)
    valid = topk_idx >= 0
    flat_idx = topk_idx.clamp_min(0).long().reshape(-1)  # (N*K,)
    counts = logcnt[flat_idx]  # (N*K,)
    if strategy == "token_hash":
        if token_ids is None:
            token_ids = torch.arange(topk_idx.shape[0], device=device)
        tok = token_ids.to(device).long().view(-1, 1).expand_as(topk_idx).reshape(-1)  # (N*K,)
        choice = _hash_choice(flat_idx, tok, counts)
    elif strategy == "round_robin":
        start = (
            round_robin_start.to(device)
            if round_robin_start is not None
            else torch.zeros_like(logcnt)
        )
        # pairs routed to no expert must not advance the counters
        masked = torch.where(valid.reshape(-1), flat_idx, logcnt.shape[0])
        ext_start = torch.cat([start, start.new_zeros(1)])
        ext_counts = torch.cat([logcnt, logcnt.new_ones(1)])
        choice = _round_robin_choice(masked, ext_counts[masked], ext_start)
    else:
        if replica_load is None:
            replica_load = torch.zeros(int(logcnt.sum()), dtype=torch.float64)
        masked_pairs = flat_idx[valid.reshape(-1)]
        sub = _least_loaded_choice(masked_pairs, log2phy, logcnt[masked_pairs], replica_load)
        choice = torch.zeros_like(flat_idx)
        choice[valid.reshape(-1)] = sub
    phys = log2phy[flat_idx, choice].view_as(topk_idx)  # (N, K)
    return torch.where(valid, phys, -1)


@dataclass
class ReplicaRouter:
    """Stateful replica routing for one MoE layer: carries the round-robin counters.

    Attributes:
        log2phy: (E, C) int64, logcnt: (E,) int64: the layer's current placement.
        strategy: see :func:`route_to_replicas`.
    """

    log2phy: torch.Tensor
    logcnt: torch.Tensor
    strategy: ReplicaStrategy = "round_robin"
    round_robin_start: torch.Tensor = field(init=False)

    def __post_init__(self) -> None:
        if self.strategy not in STRATEGIES:
            raise ValueError(f"strategy={self.strategy!r}: use one of {STRATEGIES}")
        self.round_robin_start = torch.zeros_like(self.logcnt)

    def set_placement(self, log2phy: torch.Tensor, logcnt: torch.Tensor) -> None:
        """Switch to a new placement (after a rebalance); counters restart."""
        self.log2phy, self.logcnt = log2phy, logcnt
        self.round_robin_start = torch.zeros_like(logcnt)

    def __call__(
        self,
        topk_idx: torch.Tensor,
        *,
        token_ids: torch.Tensor | None = None,
        replica_load: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Logical ``topk_idx (N, K)`` -> physical ``(N, K)``."""
        phys = route_to_replicas(
            topk_idx,
            self.log2phy,
            self.logcnt,
            strategy=self.strategy,
            token_ids=token_ids,
            round_robin_start=self.round_robin_start,
            replica_load=replica_load,
        )
        if self.strategy == "round_robin":
            valid = topk_idx[topk_idx >= 0].long().cpu()
            seen = torch.bincount(valid, minlength=self.logcnt.shape[0])
            self.round_robin_start = (self.round_robin_start + seen) % self.logcnt.cpu()
        return phys
