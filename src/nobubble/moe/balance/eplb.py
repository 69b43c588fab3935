"""Expert-parallel load balancing with redundant experts (EPLB), no expert twice on one GPU.

Choose how many replicas each logical expert gets and on which GPU each lives, so that the
heaviest GPU carries as little as possible (a replica of ``e`` serves ``load[e] /
logcnt[e]``). Policies as in DeepSeek's EPLB: **hierarchical** (``num_groups % num_nodes ==
0``: groups onto nodes, replicate inside each node, pack onto its GPUs) and **global**. Unlike
EPLB an expert gets at most one replica per GPU, and an invalid configuration raises
``ValueError``; otherwise the result is EPLB's, ties included. See ``docs/moe/balance.md``.

Shapes: ``L`` MoE layers, ``E`` logical experts, ``R`` physical experts, ``G`` GPUs,
``N`` nodes.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch

from nobubble.moe.balance.packing import Packing, balanced_packing, replicate_experts
from nobubble.moe.balance.problem import Policy, check_config, resolve_policy

__all__ = [
    "Policy",
    "ExpertPlacement",
    "rebalance_experts",
    "placement_from_phy2log",
    "gpu_loads",
    "load_imbalance",
    "duplicate_gpus",
    "balanced_packing",
    "Packing",
    "replicate_experts",
    "resolve_policy",
    "check_config",
]


@dataclass(frozen=True)
class ExpertPlacement:
    """Where every replica lives. Unpacks as ``phy2log, log2phy, logcnt`` (EPLB's order).

    Physical expert ``p`` lives on GPU ``p // experts_per_gpu`` (slot ``p % experts_per_gpu``);
    GPU ``g`` is on node ``g // (num_gpus // num_nodes)``.
    """

    phy2log: torch.Tensor
    """(L, R) int64: the logical expert of each physical expert."""
    log2phy: torch.Tensor
    """(L, E, max_count) int64: the physical ids of each logical expert, ascending, -1 padded."""
    logcnt: torch.Tensor
    """(L, E) int64: number of replicas of each logical expert (>= 1)."""
    num_gpus: int
    num_nodes: int
    policy: str
    """"hierarchical" or "global": the policy that produced the placement."""

    def __iter__(self) -> Iterator[torch.Tensor]:
        return iter((self.phy2log, self.log2phy, self.logcnt))

    @property
    def num_layers(self) -> int:
        return int(self.phy2log.shape[0])

    @property
    def num_replicas(self) -> int:
        return int(self.phy2log.shape[1])

    @property
    def num_logical_experts(self) -> int:
        return int(self.logcnt.shape[1])

    @property
    def experts_per_gpu(self) -> int:
        return self.num_replicas // self.num_gpus

    def gpu_loads(self, weight: torch.Tensor) -> torch.Tensor:
        """(L, G) float64: tokens each GPU serves when replicas split their expert evenly."""
        return gpu_loads(weight, self.phy2log, self.num_gpus)

    def imbalance(self, weight: torch.Tensor) -> torch.Tensor:
        """(L,) float64: max GPU load / mean GPU load per layer (1.0 is perfect)."""
        return load_imbalance(self.gpu_loads(weight))

    def duplicate_gpus(self) -> torch.Tensor:
        """(L,) int64: how many GPUs hold some logical expert more than once (0 here)."""
        return duplicate_gpus(self.phy2log, self.num_gpus)


def gpu_loads(weight: torch.Tensor, phy2log: torch.Tensor, num_gpus: int) -> torch.Tensor:
    """Per-GPU load of a placement: ``weight (L, E)``, ``phy2log (L, R)`` -> ``(L, G)`` float64.

    Replicas of one expert share its load evenly, so a replica of ``e`` carries
    ``weight[e] / logcnt[e]`` with ``logcnt`` counted from ``phy2log``.
    """
    weight = weight.detach().double().cpu()
    phy2log = phy2log.cpu()
    num_layers, num_log = weight.shape
    logcnt = torch.zeros(num_layers, num_log, dtype=torch.float64)
    logcnt.scatter_add_(1, phy2log, torch.ones_like(phy2log, dtype=torch.float64))
    per_replica = (weight / logcnt.clamp_min(1)).gather(1, phy2log)  # (L, R)
    return per_replica.view(num_layers, num_gpus, -1).sum(-1)  # (L, G)


def duplicate_gpus(phy2log: torch.Tensor, num_gpus: int) -> torch.Tensor:
    """``phy2log (L, R)`` -> ``(L,)`` int64: GPUs that hold some logical expert more than once
    (physical experts ``g * R/G .. (g+1) * R/G - 1`` live on GPU ``g``)."""
    per_gpu = phy2log.view(phy2log.shape[0], num_gpus, -1)  # (L, G, R/G)
    srt = per_gpu.sort(-1).values
    return (srt[..., 1:] == srt[..., :-1]).any(-1).sum(-1)


def load_imbalance(loads: torch.Tensor) -> torch.Tensor:
    """``loads (..., G)`` -> ``(...)``: max / mean GPU load; 1.0 where nothing is loaded."""
    loads = loads.double()
    mean = loads.mean(-1)
    return torch.where(mean > 0, loads.max(-1).values / mean.clamp_min(1e-300), 1.0)


def place_layer(
    load: Sequence[float], num_replicas: int, num_groups: int, num_nodes: int, num_gpus: int
) -> list[int]:
    """Hierarchical placement of one layer; returns phy2log (length R). Global = 1 group/node."""
    num_log = len(load)
    group_size = num_log // num_groups
    gpus_per_node = num_gpus // num_nodes
    phy_per_node = num_replicas // num_nodes
    # 1. pack expert groups onto nodes
    group_load = [sum(load[g * group_size : (g + 1) * group_size]) for g in range(num_groups)]
    node_groups = balanced_packing(group_load, num_nodes)
    phy2log: list[int] = []
    for groups in node_groups:
        # experts of this node, in group placement order
        node_experts = [g * group_size + j for g in groups for j in range(group_size)]
        node_load = [load[e] for e in node_experts]
        for gpu in _place_node(node_load, phy_per_node, gpus_per_node):
            phy2log.extend(node_experts[m] for m in gpu)
    return phy2log


def _place_node(node_load: Sequence[float], num_phy: int, num_gpus: int) -> list[list[int]]:
    """Replicate (step 2) and pack (step 3) one node's experts; per GPU, the expert ids.

    Candidates for the replica counts, best heaviest GPU kept (the first on ties):

    1. EPLB's greedy counts capped at one replica per GPU: EPLB's answer when it packs
       without conflicts;
    2. caps one and two lower: when the hottest expert sits on nearly every GPU, the next
       hot expert's replicas must share GPUs with it, and fewer replicas can balance better;
    3. EPLB's own packing with each expert's replicas on one GPU merged into one (what its
       duplicates amount to), the freed slots given to the next-hottest experts among those
       EPLB did not double up, or among those it did not replicate.
    """
    candidates: list[list[int]] = []
    lowest = -(-num_phy // len(node_load))  # the least cap that still places every replica
    cap = num_gpus
    while cap >= lowest and (not candidates or cap >= num_gpus - 2):
        candidates.append(replicate_experts(node_load, num_phy, max_count=cap))
        top = max(_counts(candidates[-1], len(node_load)))
        cap = min(cap, top) - 1  # a cap above the top count changes nothing
    eplb_phy = replicate_experts(node_load, num_phy, max_count=num_phy)
    eplb_counts = _counts(eplb_phy, len(node_load))
    eplb_packs = balanced_packing([node_load[m] / eplb_counts[m] for m in eplb_phy], num_gpus)
    merged = [0] * len(node_load)
    for gpu in eplb_packs:
        for m in {eplb_phy[i] for i in gpu}:
            merged[m] += 1
    if merged != eplb_counts:
        # the freed slots go to experts EPLB did not double up / did not replicate at all
        for caps in (
            [num_gpus if m == c else m for m, c in zip(merged, eplb_counts)],
            [num_gpus if c == 1 else m for m, c in zip(merged, eplb_counts)],
        ):
            if sum(caps) >= num_phy:
                candidates.append(replicate_experts(node_load, num_phy, caps, initial=merged))
    best: tuple[float, list[list[int]]] | None = None
    for node_phy in candidates:
        counts = _counts(node_phy, len(node_load))
        replica_load = [node_load[m] / counts[m] for m in node_phy]
        packs = balanced_packing(replica_load, num_gpus, labels=node_phy)
        peak = max(sum(replica_load[i] for i in gpu) for gpu in packs)
        if best is None or peak < best[0] * (1 - 1e-12):
            best = (peak, [[node_phy[i] for i in gpu] for gpu in packs])
    assert best is not None
    return best[1]


def _counts(phy2log: Sequence[int], num_log: int) -> list[int]:
    counts = [0] * num_log
    for m in phy2log:
        counts[m] += 1
    return counts


def placement_from_phy2log(
    phy2log: torch.Tensor, num_logical_experts: int, num_gpus: int, num_nodes: int, policy: str
) -> ExpertPlacement:
    """Build the full placement (log2phy, logcnt) from ``phy2log (L, R)``; checks coverage."""
    phy2log = phy2log.to(torch.int64).cpu()
    num_layers, num_replicas = phy2log.shape
    if phy2log.min() < 0 or phy2log.max() >= num_logical_experts:
        raise ValueError(f"phy2log holds ids outside [0, {num_logical_experts})")
    logcnt = torch.zeros(num_layers, num_logical_experts, dtype=torch.int64)
    logcnt.scatter_add_(1, phy2log, torch.ones_like(phy2log))
    if (logcnt == 0).any():
        missing = (logcnt == 0).nonzero()[0].tolist()
        raise ValueError(f"layer {missing[0]}: logical expert {missing[1]} has no replica")
    max_count = int(logcnt.max())
    log2phy = torch.full((num_layers, num_logical_experts, max_count), -1, dtype=torch.int64)
    # the k-th replica (ascending physical id) of expert e goes to column k
    order = torch.sort(phy2log, dim=1, stable=True)  # physical ids grouped by logical id
    starts = torch.cumsum(logcnt, 1) - logcnt  # (L, E)
    col = torch.arange(num_replicas).expand(num_layers, -1) - starts.gather(1, order.values)
    log2phy[torch.arange(num_layers).unsqueeze(1), order.values, col] = order.indices
    return ExpertPlacement(phy2log, log2phy, logcnt, num_gpus, num_nodes, policy)


def _check_weight(weight: torch.Tensor) -> torch.Tensor:
    if not isinstance(weight, torch.Tensor) or weight.dim() != 2:
        raise ValueError("weight must be a 2-D tensor (num_layers, num_logical_experts)")
    weight = weight.detach().double().cpu()
    if not torch.isfinite(weight).all() or (weight < 0).any():
        raise ValueError("weight must hold finite, non-negative loads")
    return weight


def rebalance_experts(
    weight: torch.Tensor,
    num_replicas: int,
    num_groups: int,
    num_nodes: int,
    num_gpus: int,
    *,
    policy: Policy = "auto",
) -> ExpertPlacement:
    """Place ``num_replicas`` physical experts on ``num_gpus`` GPUs for loads ``weight (L, E)``.

    Args:
        weight: (L, E) any real dtype: tokens (or a moving average of them) per logical expert.
        num_replicas: physical experts in total (E plus the redundant ones), multiple of G.
        num_groups: expert groups of group-limited routing (E / num_groups experts each).
        num_nodes: nodes (the fast intra-node network joins the GPUs of one node).
        num_gpus: GPUs, a multiple of ``num_nodes``.
        policy: "auto" (hierarchical when the groups divide over the nodes), "hierarchical"
            or "global".

    Returns:
        :class:`ExpertPlacement` (unpacks as ``phy2log (L, R)``, ``log2phy (L, E, max_count)``
        padded with -1, ``logcnt (L, E)``, all int64).
    """
    weight = _check_weight(weight)
    num_layers, num_log = weight.shape
    resolved = check_config(num_log, num_replicas, num_groups, num_nodes, num_gpus, policy)
    groups, nodes = (num_groups, num_nodes) if resolved == "hierarchical" else (1, 1)
    rows = [
        place_layer(weight[layer].tolist(), num_replicas, groups, nodes, num_gpus)
        for layer in range(num_layers)
    ]
    phy2log = torch.tensor(rows, dtype=torch.int64).view(num_layers, num_replicas)
    return placement_from_phy2log(phy2log, num_log, num_gpus, num_nodes, resolved)
