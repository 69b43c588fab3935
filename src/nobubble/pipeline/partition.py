"""How a pipeline of blocks is cut into contiguous stages: one module for every caller.

A cut's step time is about its slowest stage's, ``max_r speed_r * sum(cost of stage r's
layers)`` (``speed_r``: rank r's time per unit of cost, all 1 on alike ranks).
:func:`balanced_sizes` finds the least such bottleneck (exact, dynamic programming);
:func:`bottleneck` and :func:`held_costs` evaluate a cut; :func:`stage_sizes` is the one rule
for alike ranks (equal block counts without costs, the least-bottleneck cut with them). Pure
functions, no torch.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

from nobubble.validation import finite

__all__ = ["balanced_sizes", "bottleneck", "held_costs", "check_costs_and_speeds", "equal_sizes",
           "stage_sizes", "stage_ranges"]  # fmt: skip


def check_costs_and_speeds(costs: Sequence[float], speeds: Sequence[float]) -> None:
    """Raise ValueError unless every layer cost and rank speed is finite and > 0 and every
    rank can hold at least one layer."""
    if not speeds:
        raise ValueError("partition: no ranks (speeds is empty); give one speed per rank")
    if len(costs) < len(speeds):
        raise ValueError(f"partition: {len(costs)} layers for {len(speeds)} ranks; every rank "
                         "needs at least one layer: use fewer ranks or more layers")  # fmt: skip
    for name, values in (("layer cost", costs), ("rank speed", speeds)):
        bad = [(i, v) for i, v in enumerate(values) if not (finite(v) and v > 0)]
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
    found, least = _least_bottleneck_cut(costs, speeds)
    p, n = len(speeds), len(costs)
    fits = prefer is not None and len(prefer) == p and sum(prefer) == n and min(prefer) >= 1
    if fits and bottleneck(prefer, costs, speeds) <= least * (1 + 1e-9):  # type: ignore[arg-type]
        return tuple(prefer)  # type: ignore[arg-type]
    return found


def held_costs(sizes: Sequence[int], costs: Sequence[float]) -> tuple[float, ...]:
    """The layer cost each rank holds under the contiguous cut ``sizes``."""
    return tuple(sum(costs[r.start : r.stop]) for r in stage_ranges(sizes))


def stage_ranges(sizes: Sequence[int]) -> tuple[range, ...]:
    """The block indices of each stage of the contiguous cut ``sizes`` (blocks per stage)."""
    starts = (0, *itertools.accumulate(sizes))
    return tuple(range(a, b) for a, b in itertools.pairwise(starts))


def equal_sizes(num_blocks: int, num_stages: int) -> tuple[int, ...]:
    """``num_blocks`` blocks as ``num_stages`` contiguous stages of equal block counts; when
    it does not divide, the first ``num_blocks % num_stages`` stages hold one block more."""
    _check_stage_count(num_blocks, num_stages)
    base, extra = divmod(num_blocks, num_stages)
    return tuple(base + (s < extra) for s in range(num_stages))


def stage_sizes(
    num_blocks: int, num_stages: int, costs: Sequence[float] | None = None
) -> tuple[int, ...]:
    """Blocks per stage (in pipeline order, each >= 1, summing to ``num_blocks``) of the cut
    of ``num_blocks`` blocks into ``num_stages`` contiguous stages on alike ranks.

    Args:
        costs: None: :func:`equal_sizes`. Otherwise one cost per block (any unit: a
            parameter count, ms), each finite and >= 0: the cut whose most costly stage
            costs least (exact min-max over every contiguous cut, the DP of
            :func:`balanced_sizes` at equal speeds; among equally good cuts each stage
            starts as early as it can). Zero costs are allowed (a block without
            parameters); when every cost is 0 every cut is as good and the equal one is
            returned.

    Raises:
        ValueError: ``num_stages`` outside ``1..num_blocks``, ``len(costs) != num_blocks``,
            or a cost that is negative, nan or infinite (before any work).
    """
    _check_stage_count(num_blocks, num_stages)
    if costs is None:
        return equal_sizes(num_blocks, num_stages)
    if len(costs) != num_blocks:
        raise ValueError(f"stage_sizes: {len(costs)} costs for {num_blocks} blocks; give one "
                         "cost per block, in pipeline order")  # fmt: skip
    for i, c in enumerate(costs):
        if not (finite(c) and c >= 0):
            raise ValueError(f"stage_sizes: block {i}'s cost is {c!r}; every cost must be "
                             "finite and >= 0 (a parameter count, a time)")  # fmt: skip
    if not any(costs):
        return equal_sizes(num_blocks, num_stages)
    return _least_bottleneck_cut(costs, (1.0,) * num_stages)[0]


def _check_stage_count(num_blocks: int, num_stages: int) -> None:
    if not 1 <= num_stages <= num_blocks:
        raise ValueError(f"num_stages={num_stages} for {num_blocks} blocks; use 1..{num_blocks}"
                         " stages (each stage holds at least one block)")  # fmt: skip


def _least_bottleneck_cut(
    costs: Sequence[float], speeds: Sequence[float]
) -> tuple[tuple[int, ...], float]:
    """The DP behind :func:`balanced_sizes` and :func:`stage_sizes`: the cut (layers per
    rank) with the least bottleneck, and that bottleneck. Needs ``1 <= len(speeds) <=
    len(costs)``, costs >= 0 and speeds > 0 (the callers check). O(p L^2) time."""
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
            for i in range(r, j):  # rank r holds layers i..j-1; the first i always sets best
                value = max(best[r - 1][i], speeds[r] * (prefix[j] - prefix[i]))
                if value < best[r][j] * (1 - 1e-12):
                    best[r][j], cut[r][j] = value, i
    sizes, j = [], n
    for r in range(p - 1, 0, -1):
        i = cut[r][j]
        sizes.append(j - i)
        j = i
    sizes.append(j)
    return tuple(reversed(sizes)), best[p - 1][n]
