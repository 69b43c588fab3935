"""Greedy primitives of EPLB: replicate hot experts, pack items into equal-count packs.

Both are EPLB's greedy rules (largest load-per-replica first; heaviest item into the
lightest open pack, stable on ties) with one addition: a pack never holds two items of one
label (two replicas of one logical expert on one GPU). Pure Python on lists: a layer has at
most a few hundred items, and the rules read as written.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Protocol

__all__ = ["replicate_experts", "Packing", "balanced_packing"]


class ItemLoads(Protocol):
    """What :class:`Packing` reads of the loads: ``loads[item]`` (a list, or a lookup)."""

    def __getitem__(self, item: int, /) -> float: ...


def replicate_experts(
    loads: Sequence[float],
    num_phy: int,
    max_count: int | Sequence[int],
    initial: Sequence[int] | None = None,
) -> list[int]:
    """Give ``num_phy`` replicas to ``len(loads)`` experts, minimising the largest per-replica load.

    Each expert starts with ``initial[e]`` replicas (default one); each further replica goes
    to the expert with the largest ``load / count`` (the first on ties) among those with
    fewer than ``max_count`` (one cap for all, or one per expert). Returns ``phy2log`` (length ``num_phy``): ``0..n-1`` first,
    then the other initial replicas, then the added ones in the order they were added.
    """
    num_log = len(loads)
    caps = [max_count] * num_log if isinstance(max_count, int) else list(max_count)
    counts = list(initial) if initial is not None else [1] * num_log
    phy2log = list(range(num_log)) + [e for e in range(num_log) for _ in range(counts[e] - 1)]
    for _ in range(len(phy2log), num_phy):
        best, best_load = -1, -math.inf
        for e in range(num_log):
            if counts[e] < caps[e] and loads[e] / counts[e] > best_load:
                best, best_load = e, loads[e] / counts[e]
        assert best >= 0, "check_config guarantees room for every replica"
        phy2log.append(best)
        counts[best] += 1
    return phy2log


class Packing:
    """Packs of equal capacity holding labelled items; a pack never holds a label twice.

    The mutable working state of :func:`balanced_packing` and of the incremental rebalance:
    ``packs[p]`` lists item ids in slot order, ``pack_loads[p]`` their summed load.
    """

    def __init__(
        self, num_packs: int, per_pack: int, loads: ItemLoads, labels: Sequence[int]
    ) -> None:
        self.per_pack = per_pack
        self.loads = loads
        self.labels = labels
        self.packs: list[list[int]] = [[] for _ in range(num_packs)]
        self.pack_loads = [0.0] * num_packs
        self.held: list[set[int]] = [set() for _ in range(num_packs)]
        self.num_conflicts = 0
        """Items that could not go to the lightest open pack because of their label."""

    def add(self, pack: int, item: int) -> None:
        assert self.labels[item] not in self.held[pack] and len(self.packs[pack]) < self.per_pack
        self.packs[pack].append(item)
        self.pack_loads[pack] += self.loads[item]
        self.held[pack].add(self.labels[item])

    def remove(self, pack: int, item: int) -> None:
        self.packs[pack].remove(item)
        self.pack_loads[pack] -= self.loads[item]
        self.held[pack].discard(self.labels[item])

    def place(self, item: int) -> int:
        """Put ``item`` into the lightest open pack without its label; returns the pack.

        When every open pack already has the label, one item ``x`` of a full pack ``q``
        without the label moves to an open pack without ``x``'s label (the move that keeps
        the larger of the two loads lowest) and ``item`` takes its place. Such a move always
        exists when the label has fewer items than there are packs: a full pack holds more
        distinct labels than an open one.
        """
        open_packs = [p for p in range(len(self.packs)) if len(self.packs[p]) < self.per_pack]
        label = self.labels[item]
        allowed = [p for p in open_packs if label not in self.held[p]]
        if allowed:
            pack = min(allowed, key=self.pack_loads.__getitem__)
            lightest = min(open_packs, key=self.pack_loads.__getitem__)
            self.num_conflicts += pack != lightest
        else:
            pack = self._make_room(item, open_packs)
            self.num_conflicts += 1
        self.add(pack, item)
        return pack

    def swap_down(self, peak: float, move_cost: Callable[[int, int], int] | None = None) -> None:
        """Swap items between the heaviest pack and another until the heaviest is <= ``peak``
        or no swap lowers it. A swap must lower the larger of the two packs' loads and keep
        labels distinct; the cheapest (``move_cost(item, pack it leaves)`` summed) wins, then
        the lowest resulting peak.
        """
        loads, labels, packs = self.loads, self.labels, self.packs
        for _ in range(4 * sum(len(p) for p in packs)):
            h = max(range(len(packs)), key=self.pack_loads.__getitem__)
            top = self.pack_loads[h]
            if top <= peak * (1 + 1e-9):
                return
            best: tuple[int, float, int, int, int] | None = None
            for g in range(len(packs)):
                if g == h:
                    continue
                for a in packs[h]:
                    if labels[a] in self.held[g]:
                        continue
                    for b in packs[g]:
                        if loads[b] >= loads[a] or labels[b] in self.held[h]:
                            continue
                        new_peak = max(
                            top - loads[a] + loads[b], self.pack_loads[g] - loads[b] + loads[a]
                        )
                        if new_peak >= top * (1 - 1e-9):
                            continue
                        cost = move_cost(a, h) + move_cost(b, g) if move_cost else 0
                        key = (cost, new_peak, g, a, b)
                        if best is None or key < best:
                            best = key
            if best is None:
                return
            _, _, g, a, b = best
            self.remove(h, a)
            self.remove(g, b)
            self.add(h, b)
            self.add(g, a)

    def _make_room(self, item: int, open_packs: list[int]) -> int:
        best: tuple[float, int, int, int] | None = None
        for q, members in enumerate(self.packs):
            if self.labels[item] in self.held[q] or q in open_packs:
                continue
            for x in members:
                for p in open_packs:
                    if self.labels[x] in self.held[p]:
                        continue
                    peak = max(
                        self.pack_loads[p] + self.loads[x],
                        self.pack_loads[q] - self.loads[x] + self.loads[item],
                    )
                    if best is None or peak < best[0]:
                        best = (peak, q, x, p)
        assert best is not None, "a full pack without the label always has a movable item"
        _, q, x, p = best
        self.remove(q, x)
        self.add(p, x)
        return q


def balanced_packing(
    loads: Sequence[float], num_packs: int, labels: Sequence[int] | None = None
) -> list[list[int]]:
    """Pack items into ``num_packs`` packs of equal item count, balancing the pack loads.

    Greedy as in EPLB: heaviest item first (stable on ties) into the lightest pack that has
    room. With ``labels`` (e.g. the logical expert of each replica), a pack never gets two
    items of one label (see :meth:`Packing.place`); when that forced any item away from the
    lightest pack, pairwise swaps then lower the heaviest pack as far as they can (without
    conflicts the result is exactly EPLB's). Returns the item ids of each pack, in slot order.
    """
    num_items = len(loads)
    per_pack = num_items // num_packs
    if per_pack == 1:
        return [[i] for i in range(num_items)]
    state = Packing(num_packs, per_pack, loads, labels if labels is not None else range(num_items))
    for item in sorted(range(num_items), key=lambda i: -loads[i]):
        state.place(item)
    if state.num_conflicts:
        state.swap_down(0.0)
    return state.packs
