"""Online rebalancing: new placement from live statistics, experts moved with one all-to-all.

Every rank computes the same placement from the same gathered statistics (checked by an
all-gather: a disagreement raises), then one ``all_to_all`` moves every moved physical expert's
weights and weight-shaped optimizer state from a holder of its logical expert; local replicas
are copied. Tensors are overwritten in place, so the optimizer and hooks carry on.

Lifecycle per rebalance: ``collect_load_stats`` (every step) -> :func:`rebalance_online`
(every ``interval`` steps) = plan -> :func:`plan_migration` -> :func:`migrate_rows` ->
``set_placement``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from nobubble.moe.balance.eplb import gpu_loads, load_imbalance, rebalance_experts
from nobubble.moe.balance.incremental import rebalance_experts_incremental
from nobubble.moe.balance.replicated_layer import EXPERT_PARAMS, ReplicatedMoELayer

__all__ = [
    "MigrationPlan",
    "OnlineRebalance",
    "plan_migration",
    "migrate_rows",
    "rebalance_online",
]


@dataclass(frozen=True)
class MigrationPlan:
    """Where each new physical expert's data comes from.

    Attributes:
        source: ``R`` old physical ids: new physical ``p`` copies old physical ``source[p]``
            (same logical expert; on ``p``'s own rank whenever the rank had one).
        num_ranks: ranks; rank ``r`` owns physical ``[r * R/num_ranks, (r+1) * R/num_ranks)``.
        num_moved: new physical experts copied from another rank.
    """

    source: tuple[int, ...]
    num_ranks: int
    num_moved: int

    def rank_of(self, physical: int) -> int:
        return physical // (len(self.source) // self.num_ranks)


def plan_migration(
    old_phy2log: Sequence[int], new_phy2log: Sequence[int], num_ranks: int
) -> MigrationPlan:
    """Pick a source for every new physical expert: a local replica if any, else the holder
    rank that has sent the fewest so far (spreads the copies), lowest id on ties."""
    old, new = [int(e) for e in old_phy2log], [int(e) for e in new_phy2log]
    if len(old) != len(new) or len(old) % num_ranks:
        raise ValueError(
            f"plan_migration: {len(old)} old and {len(new)} new physical experts over "
            f"{num_ranks} ranks; both must be the same multiple of the rank count"
        )
    per_rank = len(old) // num_ranks
    holders: dict[int, list[int]] = {}
    for p, e in enumerate(old):
        holders.setdefault(e, []).append(p)
    missing = sorted(set(new) - set(holders))
    if missing:
        raise ValueError(f"plan_migration: logical experts {missing} are in no old replica")
    sends = [0] * num_ranks
    source, moved = [], 0
    for p, e in enumerate(new):
        rank = p // per_rank
        local = [q for q in holders[e] if q // per_rank == rank]
        if local:
            source.append(local[0])
            continue
        q = min(holders[e], key=lambda q: (sends[q // per_rank], q))
        sends[q // per_rank] += 1
        source.append(q)
        moved += 1
    return MigrationPlan(tuple(source), num_ranks, moved)


def migrate_rows(
    tensors: Sequence[torch.Tensor], plan: MigrationPlan, rank: int, transport
) -> list[torch.Tensor]:
    """Move rows of per-physical-expert tensors to their new ranks (one collective).

    Args:
        tensors: each ``(P, ...)``, any dtype: row ``i`` belongs to old physical
            ``rank * P + i``.
        plan: from :func:`plan_migration` (the same on every rank).
        rank: this rank; transport: a :class:`~nobubble.moe.transport.Transport`.
    Returns:
        New tensors, same shapes: row ``i`` is the data of new physical ``rank * P + i``.
    """
    per_rank = len(plan.source) // plan.num_ranks
    rows = [t.detach().contiguous().reshape(per_rank, -1).view(torch.uint8) for t in tensors]
    packed = torch.cat(rows, dim=1)  # (P, bytes) every tensor's row, side by side
    # send order: destination rank, then destination physical id; recv mirrors it
    send_rows, send_splits, recv_from = [], [0] * plan.num_ranks, []
    for p, q in enumerate(plan.source):
        dst, src = plan.rank_of(p), plan.rank_of(q)
        if src == rank and dst != rank:
            send_rows.append(q - rank * per_rank)
            send_splits[dst] += 1
        if dst == rank and src != rank:
            recv_from.append((src, p))
    recv_splits = [sum(1 for s, _ in recv_from if s == r) for r in range(plan.num_ranks)]
    send = packed[torch.tensor(send_rows, dtype=torch.long, device=packed.device)]
    received = transport.all_to_all(send, send_splits, recv_splits, kind="expert_migration")
    new_packed = torch.empty_like(packed)
    for i, (_, p) in enumerate(sorted(recv_from)):  # received in source-rank, then id order
        new_packed[p - rank * per_rank] = received[i]
    for i in range(per_rank):
        q = plan.source[rank * per_rank + i]
        if plan.rank_of(q) == rank:
            new_packed[i] = packed[q - rank * per_rank]
    out, start = [], 0
    for t, r in zip(tensors, rows):
        width = r.shape[1]
        chunk = new_packed[:, start : start + width].contiguous()  # (P, width bytes)
        out.append(chunk.view(t.dtype).reshape(t.shape))
        start += width
    return out


@dataclass(frozen=True)
class OnlineRebalance:
    """What one online rebalance did."""

    old_phy2log: torch.Tensor
    """(R,) int64 placement before."""
    new_phy2log: torch.Tensor
    """(R,) int64 placement after."""
    num_moved: int
    """Physical experts copied across ranks."""
    bytes_moved: int
    """Bytes this rank sent (weights plus optimizer state)."""
    imbalance_before: float
    """max / mean rank load of the statistics under the old placement."""
    imbalance_after: float
    """The same under the new placement."""


def _state_tensors(layer: ReplicatedMoELayer, optimizer) -> list[torch.Tensor]:
    """Expert parameters, then their optimizer state tensors of the same shape (sorted keys)."""
    params = [getattr(layer, name) for name in EXPERT_PARAMS]
    out = list(params)
    if optimizer is not None:
        for p in params:
            state = optimizer.state.get(p, {})
            out += [
                state[k]
                for k in sorted(state)
                if isinstance(state[k], torch.Tensor) and state[k].shape == p.shape
            ]
    return out


def rebalance_online(
    layer: ReplicatedMoELayer,
    optimizer: torch.optim.Optimizer | None = None,
    *,
    incremental: bool = True,
    tolerance: float = 0.02,
    num_nodes: int = 1,
    num_groups: int = 1,
    weight: torch.Tensor | None = None,
) -> OnlineRebalance:
    """Re-place ``layer``'s replicas for its live statistics and move weights + optimizer state.

    Collective: call on every rank of the layer's group. ``weight (E,)`` overrides the
    statistics' moving average. ``incremental`` keeps replicas in place within ``tolerance``
    of a fresh placement's imbalance; otherwise a fresh ``rebalance_experts``.
    """
    ranks, transport = layer.buffer.num_ranks, layer.buffer.transport
    load = (weight if weight is not None else layer.load_stats.moving_average()[0]).double()
    load = load.view(1, -1).cpu()  # (1, E)
    old = layer.phy2log.clone()
    num_replicas = old.numel()
    if incremental:
        new = rebalance_experts_incremental(
            load, old.view(1, -1), num_groups, num_nodes, ranks, tolerance=tolerance
        ).placement.phy2log[0]
    else:
        new = rebalance_experts(load, num_replicas, num_groups, num_nodes, ranks).phy2log[0]
    device = layer.w_gate.device  # NCCL gathers device tensors only
    every = transport.all_gather(new.view(1, -1).to(device), kind="placement").cpu()  # (ranks, R)
    if not bool((every == new).all()):
        raise RuntimeError("rebalance_online: ranks computed different placements")
    plan = plan_migration(old.tolist(), new.tolist(), ranks)
    tensors = _state_tensors(layer, optimizer)
    before = transport.stats().bytes_sent_remote.get("expert_migration", 0)
    moved = migrate_rows(tensors, plan, layer.buffer.rank, transport)
    with torch.no_grad():
        for t, m in zip(tensors, moved):
            t.copy_(m)
    for name in EXPERT_PARAMS:
        getattr(layer, name).grad = None  # gradients belonged to the old experts
    layer.set_placement(new)
    after = transport.stats().bytes_sent_remote.get("expert_migration", 0)
    return OnlineRebalance(
        old_phy2log=old,
        new_phy2log=new,
        num_moved=plan.num_moved,
        bytes_moved=after - before,
        imbalance_before=float(load_imbalance(gpu_loads(load, old.view(1, -1), ranks))[0]),
        imbalance_after=float(load_imbalance(gpu_loads(load, new.view(1, -1), ranks))[0]),
    )
