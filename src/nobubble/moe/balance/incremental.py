"""Incremental rebalancing: a new placement that moves as few experts as it can.

The new placement must reach a target imbalance (the fresh
:func:`~nobubble.moe.balance.eplb.rebalance_experts` one's plus ``tolerance``) and, among
those that do, keep the most replicas where they are. Per layer three candidates compete
(fewest moves, then lowest imbalance): the fresh placement relabelled to overlap the current
one most (an OR-Tools assignment; it always meets the target); keep + fill + swap on the
current group-to-node assignment (or all GPUs, global); the same on the fresh assignment
(hierarchical only). A *move* is a physical expert whose logical expert was not on that GPU
before. See ``docs/moe/balance.md``.

Shapes: ``L`` layers, ``E`` logical experts, ``R`` replicas, ``G`` GPUs.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from nobubble.moe.balance.eplb import (
    ExpertPlacement,
    Policy,
    _check_weight,
    check_config,
    gpu_loads,
    load_imbalance,
    place_layer,
    placement_from_phy2log,
)
from nobubble.moe.balance.packing import Packing, replicate_experts

__all__ = ["IncrementalRebalance", "rebalance_experts_incremental", "count_moves"]

Slots = list[list[int]]  # per GPU, the logical expert in each slot


@dataclass(frozen=True)
class IncrementalRebalance:
    """The new placement and what it costs to get there from the current one."""

    placement: ExpertPlacement
    num_moved: torch.Tensor
    """(L,) int64: physical experts whose weights must be copied to their GPU."""
    num_moved_fresh: torch.Tensor
    """(L,) int64: the same for a fresh ``rebalance_experts`` placement, as it comes."""
    imbalance: torch.Tensor
    """(L,) float64: max / mean GPU load of the new placement."""
    fresh_imbalance: torch.Tensor
    """(L,) float64: max / mean GPU load of the fresh placement."""
    max_imbalance: torch.Tensor
    """(L,) float64: the target the new placement had to reach."""


def count_moves(
    old_phy2log: torch.Tensor, new_phy2log: torch.Tensor, num_gpus: int
) -> torch.Tensor:
    """(L,) int64: replicas in ``new`` whose logical expert was not on that GPU in ``old``.

    Both are ``(L, R)``; a GPU's replicas are counted as a multiset.
    """
    num_layers = old_phy2log.shape[0]
    moved = torch.zeros(num_layers, dtype=torch.int64)
    for layer in range(num_layers):
        old = _slots(old_phy2log[layer].tolist(), num_gpus)
        new = _slots(new_phy2log[layer].tolist(), num_gpus)
        moved[layer] = sum(_gpu_moves(o, n) for o, n in zip(old, new))
    return moved


def _gpu_moves(old: Sequence[int], new: Sequence[int]) -> int:
    """Replicas in ``new`` whose logical expert ``old`` does not hold (both multisets)."""
    return (Counter(new) - Counter(old)).total()


def _slots(phy2log_row: list[int], num_gpus: int) -> Slots:
    per_gpu = len(phy2log_row) // num_gpus
    return [phy2log_row[g * per_gpu : (g + 1) * per_gpu] for g in range(num_gpus)]


def _arrange(new_gpu: Sequence[int], old_gpu: Sequence[int]) -> list[int]:
    """Order ``new_gpu``'s experts so that those already on the GPU keep their old slot."""
    out: list[int | None] = [None] * len(old_gpu)
    rest = list(new_gpu)
    for slot, e in enumerate(old_gpu):
        if e in rest:
            out[slot] = e
            rest.remove(e)
    for slot in range(len(out)):
        if out[slot] is None:
            out[slot] = rest.pop(0)
    return [int(e) for e in out]  # type: ignore[arg-type]


def _assignment(score: list[list[int]]) -> list[int]:
    """Maximum-score perfect matching rows -> columns (OR-Tools linear sum assignment)."""
    from ortools.graph.python import linear_sum_assignment

    solver = linear_sum_assignment.SimpleLinearSumAssignment()
    n = len(score)
    for i in range(n):
        for j in range(n):
            solver.add_arc_with_cost(i, j, -score[i][j])
    if solver.solve() != solver.OPTIMAL:  # pragma: no cover - square complete graphs solve
        raise RuntimeError("assignment problem did not solve")
    return [solver.right_mate(i) for i in range(n)]


def _relabel(new: Slots, old: Slots, num_nodes: int) -> Slots:
    """Rename nodes, then GPUs inside nodes, of ``new`` to overlap ``old`` most."""
    gpn = len(new) // num_nodes

    def overlap(a: Sequence[int], b: Sequence[int]) -> int:
        return len(a) - _gpu_moves(b, a)

    def gpu_match(n: int, m: int) -> tuple[int, list[int]]:
        score = [
            [overlap(new[n * gpn + i], old[m * gpn + j]) for j in range(gpn)] for i in range(gpn)
        ]
        mate = _assignment(score)
        return sum(score[i][mate[i]] for i in range(gpn)), mate

    matches = [[gpu_match(n, m) for m in range(num_nodes)] for n in range(num_nodes)]
    node_mate = _assignment(
        [[matches[n][m][0] for m in range(num_nodes)] for n in range(num_nodes)]
    )
    out: Slots = [[] for _ in new]
    for n, m in enumerate(node_mate):
        for i, j in enumerate(matches[n][m][1]):
            out[m * gpn + j] = _arrange(new[n * gpn + i], old[m * gpn + j])
    return out


def _current_node_groups(
    old: Slots, num_groups: int, group_size: int, num_nodes: int
) -> list[list[int]] | None:
    """Groups held by each node in ``old``, or None when a group spans nodes."""
    gpn = len(old) // num_nodes
    node_of_group: dict[int, int] = {}
    for g, slots in enumerate(old):
        for e in slots:
            if node_of_group.setdefault(e // group_size, g // gpn) != g // gpn:
                return None
    per_node = num_groups // num_nodes
    groups = [
        [grp for grp in range(num_groups) if node_of_group.get(grp) == n] for n in range(num_nodes)
    ]
    return groups if all(len(gs) == per_node for gs in groups) else None


def _incremental_node(
    load: Sequence[float], experts: list[int], old: Slots, num_phy: int, peak: float
) -> Slots:
    """Keep + fill + swap for one node: ``experts`` are its logical experts, ``old`` its GPUs."""
    num_gpus, per_gpu = len(old), len(old[0])
    node_phy = replicate_experts([load[e] for e in experts], num_phy, max_count=num_gpus)
    want = {e: 0 for e in experts}
    for m in node_phy:
        want[experts[m]] += 1
    share = {e: load[e] / want[e] for e in experts}
    labels: list[int] = []
    original: list[int] = []  # GPU an item started on (-1: new)

    def new_item(e: int, gpu: int) -> int:
        labels.append(e)
        original.append(gpu)
        return len(labels) - 1

    state = Packing(num_gpus, per_gpu, _Loads(labels, share), labels)
    kept = {e: 0 for e in experts}
    for g, slots in enumerate(old):
        for e in slots:
            if e in want and e not in state.held[g]:
                state.add(g, new_item(e, g))
                kept[e] += 1
    for e in experts:  # too many kept: drop the replicas on the heaviest GPUs
        while kept[e] > want[e]:
            holders = [g for g in range(num_gpus) if e in state.held[g]]
            g = max(holders, key=state.pack_loads.__getitem__)
            state.remove(g, next(i for i in state.packs[g] if labels[i] == e))
            kept[e] -= 1
    missing = [e for e in experts for _ in range(want[e] - kept[e])]
    for e in sorted(missing, key=lambda e: -share[e]):
        state.place(new_item(e, -1))
    state.swap_down(peak, lambda item, gpu: int(original[item] == gpu))
    return [_arrange([labels[i] for i in state.packs[g]], old[g]) for g in range(num_gpus)]


class _Loads:
    """Item loads looked up through the item's label (replicas of one expert share a load)."""

    def __init__(self, labels: list[int], share: dict[int, float]) -> None:
        self.labels, self.share = labels, share

    def __getitem__(self, item: int) -> float:
        return self.share[self.labels[item]]


def _incremental_layer(
    load: list[float],
    old: Slots,
    node_groups: list[list[int]],
    group_size: int,
    num_replicas: int,
    peak: float,
) -> Slots:
    num_nodes = len(node_groups)
    gpn = len(old) // num_nodes
    out: Slots = []
    for n, groups in enumerate(node_groups):
        experts = [grp * group_size + j for grp in groups for j in range(group_size)]
        node_old = old[n * gpn : (n + 1) * gpn]
        out += _incremental_node(load, experts, node_old, num_replicas // num_nodes, peak)
    return out


def _peak(load: Sequence[float], slots: Slots) -> float:
    counts: dict[int, int] = {}
    for gpu in slots:
        for e in gpu:
            counts[e] = counts.get(e, 0) + 1
    return max(sum(load[e] / counts[e] for e in gpu) for gpu in slots)


def _choose_layer(
    load: list[float], old: Slots, fresh: Slots, groups: int, nodes: int, peak: float
) -> Slots:
    """The candidate (see the module docstring) within ``peak`` with the fewest moves."""
    num_replicas = sum(len(gpu) for gpu in old)
    group_size = len(load) // groups
    candidates = [_relabel(fresh, old, nodes)]
    current_groups = _current_node_groups(old, groups, group_size, nodes)
    fresh_groups = _current_node_groups(candidates[0], groups, group_size, nodes)
    for node_groups in (current_groups, fresh_groups if fresh_groups != current_groups else None):
        if node_groups is not None:
            candidates.append(
                _incremental_layer(load, old, node_groups, group_size, num_replicas, peak)
            )

    def key(slots: Slots) -> tuple[bool, int, float]:
        p = _peak(load, slots)
        moves = sum(_gpu_moves(o, n) for o, n in zip(old, slots))
        return (p > peak * (1 + 1e-9), moves, p)

    return min(candidates, key=key)


def rebalance_experts_incremental(
    weight: torch.Tensor,
    current_phy2log: torch.Tensor,
    num_groups: int,
    num_nodes: int,
    num_gpus: int,
    *,
    policy: Policy = "auto",
    tolerance: float = 0.02,
    max_imbalance: float | None = None,
) -> IncrementalRebalance:
    """A placement for ``weight (L, E)`` that keeps replicas of ``current_phy2log (L, R)`` in place.

    Args:
        weight: (L, E) loads per logical expert (new statistics).
        current_phy2log: (L, R) int64 current placement (R physical experts on G GPUs).
        num_groups, num_nodes, num_gpus, policy: as for ``rebalance_experts``.
        tolerance: the target imbalance is the fresh placement's plus this (absolute).
        max_imbalance: a fixed target max/mean GPU load instead (never below the fresh one's).

    Returns:
        :class:`IncrementalRebalance`: the placement, moves, imbalances; each layer meets its
        target (the fresh placement, renamed, always does).
    """
    weight = _check_weight(weight)
    if tolerance < 0:
        raise ValueError(f"tolerance={tolerance} must be >= 0")
    if max_imbalance is not None and max_imbalance < 1.0:
        raise ValueError(f"max_imbalance={max_imbalance} must be >= 1.0 (max/mean load)")
    current_phy2log = torch.as_tensor(current_phy2log, dtype=torch.int64).cpu()
    num_layers, num_log = weight.shape
    if current_phy2log.dim() != 2 or current_phy2log.shape[0] != num_layers:
        raise ValueError(
            f"current_phy2log must be ({num_layers}, num_replicas), got {tuple(current_phy2log.shape)}"
        )
    num_replicas = int(current_phy2log.shape[1])
    resolved = check_config(num_log, num_replicas, num_groups, num_nodes, num_gpus, policy)
    placement_from_phy2log(current_phy2log, num_log, num_gpus, num_nodes, resolved)  # validates
    groups, nodes = (num_groups, num_nodes) if resolved == "hierarchical" else (1, 1)
    chosen_rows, fresh_rows, targets = [], [], []
    for layer in range(num_layers):
        load = weight[layer].tolist()
        old = _slots(current_phy2log[layer].tolist(), num_gpus)
        fresh = _slots(place_layer(load, num_replicas, groups, nodes, num_gpus), num_gpus)
        mean = max(sum(load) / num_gpus, 1e-12)
        fresh_imb = _peak(load, fresh) / mean if sum(load) > 0 else 1.0
        target = (
            max(fresh_imb, max_imbalance) if max_imbalance is not None else fresh_imb + tolerance
        )
        chosen = _choose_layer(load, old, fresh, groups, nodes, target * mean)
        chosen_rows.append([e for gpu in chosen for e in gpu])
        fresh_rows.append([e for gpu in fresh for e in gpu])
        targets.append(target)
    new = placement_from_phy2log(torch.tensor(chosen_rows), num_log, num_gpus, num_nodes, resolved)
    fresh_phy2log = torch.tensor(fresh_rows, dtype=torch.int64)

    def imb(phy2log: torch.Tensor) -> torch.Tensor:
        return load_imbalance(gpu_loads(weight, phy2log, num_gpus))

    return IncrementalRebalance(
        placement=new,
        num_moved=count_moves(current_phy2log, new.phy2log, num_gpus),
        num_moved_fresh=count_moves(current_phy2log, fresh_phy2log, num_gpus),
        imbalance=imb(new.phy2log),
        fresh_imbalance=imb(fresh_phy2log),
        max_imbalance=torch.tensor(targets, dtype=torch.float64),
    )
