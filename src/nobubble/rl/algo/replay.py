"""Prioritized experience replay on a sum tree (Schaul et al., 2016, proportional variant),
importance weights normalised by their buffer maximum (OpenAI baselines)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import numpy as np
import torch

__all__ = ["SegmentTree", "ReplaySample", "PrioritizedReplayBuffer", "linear_beta"]

Item = TypeVar("Item")


class SegmentTree:
    """Complete ``fanout``-ary sum (``op=np.add``) or min (``op=np.minimum``) tree over
    ``capacity`` leaves (empty: 0 or +inf): ``root()`` in O(1), ``update`` and (sum tree)
    ``find_prefix`` in O(log n). ``_levels[0]`` is the root, ``_levels[depth]`` the leaves
    (padded to ``fanout ** depth``); node ``i`` has children ``i * fanout + (0 .. fanout - 1)``.
    Wide nodes keep it shallow (4 levels for a million items), each level a few numpy calls."""

    def __init__(self, capacity: int, op: np.ufunc = np.add, fanout: int = 32) -> None:
        if capacity < 1:
            raise ValueError(f"SegmentTree: capacity={capacity} must be >= 1")
        if fanout < 2:
            raise ValueError(f"SegmentTree: fanout={fanout} must be >= 2")
        self.capacity, self.fanout, self.op = capacity, fanout, op
        self._depth = 1
        while fanout**self._depth < capacity:
            self._depth += 1
        neutral = 0.0 if op is np.add else np.inf
        self._levels = [np.full(fanout**lvl, neutral) for lvl in range(self._depth + 1)]
        # Row prefix sums as one small matmul: numpy's cumsum along a short last axis costs
        # several times more than (n, fanout) @ (fanout, fanout) in BLAS.
        self._upper = np.triu(np.ones((fanout, fanout)))  # (fanout, fanout)

    def update(
        self, indices: np.ndarray | Sequence[int], values: np.ndarray | Sequence[float]
    ) -> None:
        """Set leaves ``indices`` to ``values``; O(k * fanout * depth) = O(k log n)."""
        idx = np.asarray(indices, dtype=np.int64).reshape(-1)
        vals = np.broadcast_to(np.asarray(values, dtype=np.float64), idx.shape)
        if idx.size and (idx.min() < 0 or idx.max() >= self.capacity):
            raise IndexError(f"leaf index out of range [0, {self.capacity}): {idx.tolist()}")
        # A repeated index gets one of its values (numpy picks). Parents are recomputed from
        # all their children, so a parent listed twice just gets the same value twice.
        self._levels[-1][idx] = vals
        nodes = idx
        for lvl in range(self._depth - 1, -1, -1):
            nodes = nodes // self.fanout
            children = self._levels[lvl + 1].reshape(-1, self.fanout)[nodes]  # (k, fanout)
            self._levels[lvl][nodes] = self.op.reduce(children, axis=1)

    def get(self, indices: np.ndarray | Sequence[int]) -> np.ndarray:
        return self._levels[-1][np.asarray(indices, dtype=np.int64)]

    def root(self) -> float:
        """The sum (or min) of all leaves."""
        return float(self._levels[0][0])

    def find_prefix(self, mass: np.ndarray | Sequence[float]) -> np.ndarray:
        """Sum tree: for each ``m`` in ``[0, root())``, the leaf ``i`` with ``S(i-1) <= m <
        S(i)``, ``S`` the prefix sums of the leaves. Returns int64 of ``mass``'s shape."""
        m = np.array(mass, dtype=np.float64).reshape(-1)  # a copy: consumed by the descent
        node = np.zeros(m.shape, dtype=np.int64)
        rows = np.arange(m.size)
        for lvl in range(1, self._depth + 1):  # one step per level, the whole batch at once
            children = self._levels[lvl].reshape(-1, self.fanout)[node]  # (n, fanout)
            cum = children @ self._upper  # (n, fanout) prefix sums along each row
            j = (cum <= m[:, None]).sum(axis=1)  # first child whose prefix sum exceeds m
            over = j == self.fanout
            if over.any():
                # Float rounding left m at (or past) the node's total: take the last child
                # with positive mass rather than stepping past it or onto an empty leaf.
                j[over] = self.fanout - 1 - np.argmax(children[over, ::-1] > 0, axis=1)
            m -= np.where(j > 0, cum[rows, j - 1], 0.0)
            node = node * self.fanout + j
        return node.reshape(np.shape(mass))


@dataclass(frozen=True)
class ReplaySample(Generic[Item]):
    """A prioritized batch: ``indices`` ``(n,)`` int64 slots (for ``update_priorities``),
    ``items`` in draw order, ``weights`` ``(n,)`` float32 IS weights in (0, 1] and
    ``probabilities`` ``(n,)`` float64, each draw's ``P(i)``."""

    indices: np.ndarray
    items: list[Item]
    weights: torch.Tensor
    probabilities: np.ndarray


class PrioritizedReplayBuffer(Generic[Item]):
    """Ring buffer of ``capacity`` (>= 1) items, prioritized by ``(priority + eps)^alpha``
    (``alpha`` in [0, 1], 0: uniform; ``eps > 0``), IS-corrected by ``beta`` in [0, 1] (1: full;
    anneal it with :func:`linear_beta`), drawing with its own generator from ``seed``.
    Invariant: slot ``i < len(self)`` holds an item and leaf ``i`` of the sum and min trees its
    leaf value; other leaves are empty. Full, ``extend`` overwrites the oldest. Thread-safe;
    it pickles (the lock made anew)."""

    def __init__(
        self,
        capacity: int,
        *,
        alpha: float = 0.6,
        beta: float = 0.4,
        eps: float = 1e-6,
        seed: int = 0,
    ) -> None:
        for name, value in (("alpha", alpha), ("beta", beta)):
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"PrioritizedReplayBuffer: {name}={value} must be in [0, 1]")
        if eps <= 0:
            raise ValueError(f"PrioritizedReplayBuffer: eps={eps} must be > 0 (e.g. 1e-6)")
        self.capacity, self.alpha, self.beta, self.eps = capacity, alpha, beta, eps
        self._rng = np.random.default_rng(seed)
        self._lock = threading.Lock()
        self.clear()

    def clear(self) -> None:
        """Drop every item: empty trees and slots, the largest priority back to 1 (the
        sampling RNG goes on)."""
        with self._lock:
            self._sum = SegmentTree(self.capacity)
            self._min = SegmentTree(self.capacity, np.minimum)
            self._items: list[Any] = [None] * self.capacity
            self._next, self._size, self._max_priority = 0, 0, 1.0

    def __len__(self) -> int:
        return self._size

    def _set_priorities(self, slots: np.ndarray, priorities: np.ndarray) -> None:
        """Leaves ``slots`` of both trees := ``(priority + eps)^alpha`` (lock held)."""
        if np.any(~np.isfinite(priorities)) or np.any(priorities < 0):
            raise ValueError(
                f"priorities must be finite and >= 0 (use |advantage|), got {priorities.tolist()}"
            )
        leaves = (priorities + self.eps) ** self.alpha
        self._sum.update(slots, leaves)
        self._min.update(slots, leaves)
        if priorities.size:
            self._max_priority = max(self._max_priority, float(priorities.max()))

    def extend(
        self, items: Sequence[Item], priorities: Sequence[float] | np.ndarray | None = None
    ) -> np.ndarray:
        """Store ``items`` (``priorities`` None: the largest seen so far, for each); returns
        their slots, ``(len(items),)`` int64."""
        with self._lock:
            if priorities is None:
                pr = np.full(len(items), self._max_priority)
            else:
                pr = np.asarray(priorities, dtype=np.float64).reshape(-1)
                if pr.size != len(items):
                    raise ValueError(f"extend: {len(items)} items but {pr.size} priorities")
            if len(items) > self.capacity:  # only the newest `capacity` items survive
                self._next = (self._next + len(items) - self.capacity) % self.capacity
                self._size = self.capacity
                items, pr = list(items)[-self.capacity :], pr[-self.capacity :]
            slots = (self._next + np.arange(len(items))) % self.capacity
            self._set_priorities(slots, pr)
            for slot, item in zip(slots.tolist(), items):
                self._items[slot] = item
            self._next = int((self._next + len(items)) % self.capacity)
            self._size = min(self.capacity, self._size + len(items))
            return slots

    def sample(
        self,
        batch_size: int,
        beta: float | None = None,
        *,
        eligible: Callable[[Item], bool] | None = None,
        replace: bool = True,
    ) -> ReplaySample[Item]:
        """Draw ``batch_size`` items i.i.d. from the set ``E`` of items where ``eligible(item)``
        (None: all) with probability and IS weight

            P_E(i) = (p_i + eps)^alpha / sum_{k in E} (p_k + eps)^alpha
            w_i = (|E| P_E(i))^(-beta) / max_{j in E} (|E| P_E(j))^(-beta)

        (``probabilities``: each draw's ``P_E``). ``replace=False`` draws ``min(batch_size,
        |E|)`` distinct items by successive sampling (``P_E`` renormalised over those not yet
        drawn; weights as above); no eligible item: an empty sample. O(batch_size log n)
        unrestricted with replacement, otherwise O(n)."""
        beta = self.beta if beta is None else beta
        if batch_size < 1:
            raise ValueError(f"sample: batch_size={batch_size} must be >= 1")
        if not 0.0 <= beta <= 1.0:
            raise ValueError(f"sample: beta={beta} must be in [0, 1]")
        with self._lock:
            if self._size == 0:
                raise ValueError("sample: the buffer is empty; add experience first")
            if eligible is None and replace:
                total = self._sum.root()
                idx = self._sum.find_prefix(self._rng.random(batch_size) * total)
                probs = self._sum.get(idx) / total
                p_min = self._min.root() / total
            else:
                idx, probs, p_min = self._draw_among(batch_size, eligible, replace)
            weights = torch.as_tensor((probs / p_min) ** (-beta), dtype=torch.float32)
            items = [self._items[i] for i in idx.tolist()]
        return ReplaySample(idx, items, weights, probs)

    def _draw_among(
        self, batch_size: int, eligible: Callable[[Item], bool] | None, replace: bool
    ) -> tuple[np.ndarray, np.ndarray, float]:
        """Slots drawn from the eligible set, their ``P_E`` and ``min P_E`` (lock held)."""
        slots = np.arange(self._size)
        if eligible is not None:
            keep = [bool(eligible(self._items[i])) for i in range(self._size)]
            slots = slots[np.array(keep, dtype=bool)]  # (|E|,)
        if slots.size == 0:
            return slots, np.zeros(0), 1.0
        leaves = self._sum.get(slots)  # (|E|,) (p + eps)^alpha
        p_e = leaves / leaves.sum()
        size = batch_size if replace else min(batch_size, slots.size)
        # numpy's choice without replacement keeps the first distinct values of i.i.d.
        # draws, renormalising after each round: successive sampling, as documented above
        pick = self._rng.choice(slots.size, size=size, replace=replace, p=p_e)
        return slots[pick], p_e[pick], float(p_e.min())

    def update_priorities(
        self,
        indices: np.ndarray | Sequence[int],
        priorities: np.ndarray | Sequence[float] | torch.Tensor,
    ) -> None:
        """Set new priorities (e.g. fresh ``|advantage|``) for sampled slots."""
        idx = np.asarray(indices, dtype=np.int64).reshape(-1)
        pr = torch.as_tensor(priorities).detach().cpu().double().numpy().reshape(-1)
        if idx.shape != pr.shape:
            raise ValueError(f"update_priorities: {idx.size} indices but {pr.size} priorities")
        with self._lock:
            if idx.size and (idx.min() < 0 or idx.max() >= self._size):
                raise ValueError(
                    f"update_priorities: slots must be in [0, {self._size}), got {idx.tolist()}"
                )
            self._set_priorities(idx, pr)

    def __getstate__(self) -> dict[str, Any]:
        """Pickle everything but the lock (a checkpoint holds the buffer, RNG included)."""
        with self._lock:
            return {name: value for name, value in self.__dict__.items() if name != "_lock"}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()


def linear_beta(step: int, total_steps: int, beta0: float = 0.4) -> float:
    """Anneal beta linearly from ``beta0`` at step 0 to 1 at ``total_steps``."""
    if total_steps < 1:
        raise ValueError(f"linear_beta: total_steps={total_steps} must be >= 1")
    return beta0 + (1.0 - beta0) * min(1.0, max(step, 0) / total_steps)
