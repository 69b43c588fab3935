"""The contiguous cut of a pipeline with the least bottleneck: one exact DP for every caller.

A pipeline of ``L`` layers (blocks) cut into ``p`` contiguous stages runs a step in about the
time of its slowest stage: ``max_r speed_r * sum(cost of stage r's layers)``, where ``cost``
is each layer's nominal cost (any unit) and ``speed_r`` the time rank ``r`` takes per unit of
it (all 1 when the ranks are alike). :func:`balanced_sizes` finds the cut with the least such
bottleneck (exact, dynamic programming over cut points); :func:`bottleneck` and
:func:`held_costs` evaluate a given cut.

Pure functions, no torch: the planner (:mod:`nobubble.pipeline.plan`) starts its search from
this cut, and the elastic re-plan (:mod:`nobubble.pipeline.runtime.elastic.partition`)
re-cuts with it at measured speeds.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

__all__ = ["balanced_sizes", "bottleneck", "held_costs", "check_costs_and_speeds"]


def check_costs_and_speeds(costs: Sequence[float], speeds: Sequence[float]) -> None:
    """Raise ValueError unless every layer cost and rank speed is finite and > 0 and every
    rank can hold at least one layer."""
    if not speeds:
        raise ValueError("partition: no ranks (speeds is empty); give one speed per rank")
    if len(costs) < len(speeds):
        raise ValueError(f"partition: {len(costs)} layers for {len(speeds)} ranks; every rank "
                         "needs at least one layer: use fewer ranks or more layers")  # fmt: skip
    for name, values in (("layer cost", costs), ("rank speed", speeds)):
        bad = [(i, v) for i, v in enumerate(values) if not (math.isfinite(v) and v > 0)]
        if bad:
            raise ValueError(f"partition: {name} {bad[0][0]} is {bad[0][1]!r}; it must be "
                             "finite and > 0")  # fmt: skip


def bottleneck(sizes: Sequence[int], costs: Sequence[float], speeds: Sequence[float]) -> float:
    """``max_r speeds[r] * sum(costs of rank r's layers)`` for the cut ``sizes`` (layers per
    rank, in order)."""
    if sum(sizes) != len(costs) or len(sizes) != len(speeds) or min(sizes, default=0) < 1:
        raise ValueError(f"bottleneck: sizes {list(sizes)} must be {len(speeds)} counts >= 1 "
                         f"summing to {len(costs)} layers")  # fmt: skip
    return max(speed * c for speed, c in zip(speeds, held_costs(sizes, costs), strict=True))


def balanced_sizes(
    costs: Sequence[float], speeds: Sequence[float], *, prefer: Sequence[int] | None = None
) -> tuple[int, ...]:
    """The contiguous cut of ``costs`` (one per layer, in pipeline order) into
    ``len(speeds)`` stages of at least one layer each with the least :func:`bottleneck`.

    ``prefer`` (the current cut) is kept when its bottleneck is within 1e-9 (relative) of the
    least; otherwise the DP's cut, which gives each rank the earliest start that reaches the
    least bottleneck of the ranks before it. O(p L^2) time.
    """
    check_costs_and_speeds(costs, speeds)
    p, n = len(speeds), len(costs)
    prefix = [0.0]
    for c in costs:
        prefix.append(prefix[-1] + c)
    # best[r][j]: least bottleneck of layers 0..j-1 on ranks 0..r; cut[r][j]: where rank r starts
    best = [[math.inf] * (n + 1) for _ in range(p)]
    cut = [[0] * (n + 1) for _ in range(p)]
    for j in range(1, n + 1):
        best[0][j] = speeds[0] * prefix[j]
    for r in range(1, p):
        for j in range(r + 1, n + 1):
            for i in range(r, j):  # rank r holds layers i..j-1
                value = max(best[r - 1][i], speeds[r] * (prefix[j] - prefix[i]))
                if value < best[r][j] * (1 - 1e-12):
                    best[r][j], cut[r][j] = value, i
    sizes, j = [], n
    for r in range(p - 1, 0, -1):
        i = cut[r][j]
        sizes.append(j - i)
        j = i
    sizes.append(j)
    found = tuple(reversed(sizes))
    fits = prefer is not None and len(prefer) == p and sum(prefer) == n and min(prefer) >= 1
    if fits and bottleneck(prefer, costs, speeds) <= best[p - 1][n] * (1 + 1e-9):  # type: ignore[arg-type]
        return tuple(prefer)  # type: ignore[arg-type]
    return found


def held_costs(sizes: Sequence[int], costs: Sequence[float]) -> tuple[float, ...]:
    """The layer cost each rank holds under the contiguous cut ``sizes``."""
    out, start = [], 0
    for size in sizes:
        out.append(sum(costs[start : start + size]))
        start += size
    return tuple(out)
