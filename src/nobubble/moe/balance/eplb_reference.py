"""DeepSeek's EPLB algorithm, transcribed faithfully as a reference (not used by the library).

This reproduces the published behaviour of ``deepseek-ai/EPLB`` (``eplb.py``) step for step,
ties included (``torch.sort`` descending on the float loads, first index on equal maxima),
so that tests and ``benchmarks/eplb_balance.py`` can compare :mod:`nobubble.moe.balance.eplb` with
the original on the same loads. Its known weakness is kept on purpose: the final packing of
replicas onto GPUs does not look at which logical expert a replica belongs to, so two
replicas of one expert can land on one GPU (they then share the GPU's load and waste a slot).

Shapes: ``L`` layers, ``E`` logical experts, ``R`` physical experts (replicas), ``G`` GPUs.
"""

from __future__ import annotations

import torch

__all__ = ["reference_rebalance_experts"]


def _reference_packing(weight: torch.Tensor, num_packs: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Greedy equal-count packing of ``weight (X, n)``: heaviest item to lightest open pack.

    Returns ``pack_index (X, n)`` and ``rank_in_pack (X, n)``, both int64.
    """
    num_rows, num_items = weight.shape
    per_pack = num_items // num_packs
    if per_pack == 1:
        pack_index = torch.arange(num_items, dtype=torch.int64).expand(weight.shape).clone()
        return pack_index, torch.zeros_like(pack_index)
    order = weight.float().sort(-1, descending=True).indices
    pack_index = torch.full((num_rows, num_items), -1, dtype=torch.int64)
    rank_in_pack = torch.full_like(pack_index, -1)
    for row in range(num_rows):
        loads = [0.0] * num_packs
        counts = [0] * num_packs
        for item in order[row].tolist():
            open_packs = [p for p in range(num_packs) if counts[p] < per_pack]
            pack = min(open_packs, key=loads.__getitem__)
            pack_index[row, item] = pack
            rank_in_pack[row, item] = counts[pack]
            loads[pack] += float(weight[row, item])
            counts[pack] += 1
    return pack_index, rank_in_pack


def _reference_replicate(
    weight: torch.Tensor, num_phy: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Add replicas one at a time to the expert with the largest load per replica.

    ``weight (X, n)`` -> ``phy2log (X, num_phy)``, ``replica_rank (X, num_phy)``,
    ``logcnt (X, n)``; the first ``n`` physical experts are the logical ones in order.
    """
    num_rows, num_log = weight.shape
    phy2log = torch.arange(num_phy, dtype=torch.int64).repeat(num_rows, 1)
    replica_rank = torch.zeros(num_rows, num_phy, dtype=torch.int64)
    logcnt = torch.ones(num_rows, num_log, dtype=torch.int64)
    rows = torch.arange(num_rows)
    for phy in range(num_log, num_phy):
        hottest = (weight / logcnt).max(dim=-1).indices
        phy2log[:, phy] = hottest
        replica_rank[:, phy] = logcnt[rows, hottest]
        logcnt[rows, hottest] += 1
    return phy2log, replica_rank, logcnt


def _inverse(perm: torch.Tensor) -> torch.Tensor:
    inv = torch.empty_like(perm)
    inv.scatter_(1, perm, torch.arange(perm.size(1), dtype=torch.int64).expand(perm.shape))
    return inv


def _reference_hierarchical(
    weight: torch.Tensor, num_phy: int, num_groups: int, num_nodes: int, num_gpus: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    num_layers, num_log = weight.shape
    group_size = num_log // num_groups
    groups_per_node = num_groups // num_nodes
    phy_per_gpu = num_phy // num_gpus
    # 1. groups -> nodes
    group_load = weight.unflatten(-1, (num_groups, group_size)).sum(-1)  # (L, num_groups)
    group_pack, group_rank = _reference_packing(group_load, num_nodes)
    log2mlog = (
        ((group_pack * groups_per_node + group_rank) * group_size).unsqueeze(-1)
        + torch.arange(group_size, dtype=torch.int64)
    ).flatten(-2)  # (L, E): logical id -> position in node-major order
    mlog2log = _inverse(log2mlog)
    # 2. replicate inside each node
    mlog_load = weight.gather(-1, mlog2log).view(-1, num_log // num_nodes)  # (L*N, E/N)
    phy2mlog, phy_rank, mlogcnt = _reference_replicate(mlog_load, num_phy // num_nodes)
    # 3. replicas -> GPUs of the node (blind to which expert a replica belongs to)
    phy_load = (mlog_load / mlogcnt).gather(-1, phy2mlog)  # (L*N, R/N)
    pack, rank = _reference_packing(phy_load, num_gpus // num_nodes)
    pphy2phy = _inverse(pack * phy_per_gpu + rank)
    pphy2mlog = phy2mlog.gather(-1, pphy2phy)
    offsets = torch.arange(0, num_log, num_log // num_nodes, dtype=torch.int64).view(1, -1, 1)
    pphy2mlog = (pphy2mlog.view(num_layers, num_nodes, -1) + offsets).flatten(-2)
    phy2log = mlog2log.gather(-1, pphy2mlog)
    pphy_rank = phy_rank.gather(-1, pphy2phy).view(num_layers, -1)
    logcnt = mlogcnt.view(num_layers, -1).gather(-1, log2mlog)
    return phy2log, pphy_rank, logcnt


def reference_rebalance_experts(
    weight: torch.Tensor, num_replicas: int, num_groups: int, num_nodes: int, num_gpus: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """EPLB's ``rebalance_experts``: ``weight (L, E)`` -> ``(phy2log, log2phy, logcnt)``.

    Hierarchical when ``num_groups % num_nodes == 0``, else global (one group, one node).
    ``log2phy (L, E, max_count)`` is indexed by replica rank and padded with -1.
    """
    num_layers, num_log = weight.shape
    weight = weight.float().cpu()
    if num_groups % num_nodes == 0:
        phy2log, phy_rank, logcnt = _reference_hierarchical(
            weight, num_replicas, num_groups, num_nodes, num_gpus
        )
    else:
        phy2log, phy_rank, logcnt = _reference_hierarchical(weight, num_replicas, 1, 1, num_gpus)
    max_count = int(logcnt.max())
    log2phy = torch.full((num_layers, num_log, max_count), -1, dtype=torch.int64)
    log2phy.view(num_layers, -1).scatter_(
        -1,
        phy2log * max_count + phy_rank,
        torch.arange(num_replicas, dtype=torch.int64).expand(num_layers, -1),
    )
    return phy2log, log2phy, logcnt
