"""Which layers each rank holds, given how fast each rank runs: the re-plan's arithmetic.

A pipeline of ``L`` layers cut into ``p`` contiguous stages (one per rank) runs a step in
about the time of its slowest stage: ``max_r speed_r * sum(cost of rank r's layers)``, where
``cost`` is each layer's nominal cost (any unit; equal when the layers are alike) and
``speed_r`` the time rank ``r`` takes per unit of it (measured: a 1.5x straggler has a 1.5x
speed). :func:`balanced_sizes` finds the cut with the least such bottleneck (exact, dynamic
programming over cut points); :func:`speeds_from_times` turns measured per-rank compute times
into speeds; :func:`replan_decision` says whether a new cut is worth moving layers for.

Pure functions, no torch: the same answer on every rank from the same numbers, so every rank
switches to the same cut at the same step boundary without a message.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["balanced_sizes", "bottleneck", "held_costs", "speeds_from_times", "speed_drift",
           "ReplanDecision", "replan_decision"]  # fmt: skip


def _check(costs: Sequence[float], speeds: Sequence[float]) -> None:
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
    _check(costs, speeds)
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


def speeds_from_times(
    times_ms: Sequence[float], sizes: Sequence[int], costs: Sequence[float]
) -> tuple[float, ...]:
    """Each rank's speed (ms per unit of cost) from its measured compute time in one step
    (``times_ms[r]``, waits excluded) and the layers it held (``sizes``)."""
    if len(times_ms) != len(sizes):
        raise ValueError(f"speeds_from_times: {len(times_ms)} times for {len(sizes)} ranks; "
                         "give one time per rank")  # fmt: skip
    for r, t in enumerate(times_ms):
        if not (math.isfinite(t) and t > 0):
            raise ValueError(f"speeds_from_times: rank {r}'s time is {t!r} ms; it must be "
                             "finite and > 0 (a rank that ran no op has no speed)")  # fmt: skip
    return tuple(t / c for t, c in zip(times_ms, held_costs(sizes, costs), strict=True))


def held_costs(sizes: Sequence[int], costs: Sequence[float]) -> tuple[float, ...]:
    """The layer cost each rank holds under the contiguous cut ``sizes``."""
    out, start = [], 0
    for size in sizes:
        out.append(sum(costs[start : start + size]))
        start += size
    return tuple(out)


def speed_drift(planned: Sequence[float], measured: Sequence[float]) -> float:
    """The largest relative change of a rank's speed: ``max_r |measured / planned - 1|``."""
    if len(planned) != len(measured) or not planned:
        raise ValueError(f"speed_drift: {len(planned)} planned speeds, {len(measured)} measured;"
                         " give one of each per rank")  # fmt: skip
    return max(abs(m / q - 1) for m, q in zip(measured, planned, strict=True))


@dataclass(frozen=True, slots=True)
class ReplanDecision:
    """Whether to re-cut, the cut, and the predicted bottlenecks (same unit as the speeds)."""

    replan: bool
    sizes: tuple[int, ...]
    drift: float
    """The largest relative change of a rank's speed since the last plan."""
    current: float
    """The bottleneck of the current cut at the measured speeds."""
    predicted: float
    """The bottleneck of ``sizes`` at the measured speeds."""


def replan_decision(
    sizes: Sequence[int],
    costs: Sequence[float],
    planned: Sequence[float],
    measured: Sequence[float],
    *,
    threshold: float = 0.2,
    min_gain: float = 0.05,
) -> ReplanDecision:
    """Re-cut when some rank's speed moved more than ``threshold`` (relative) from the speed
    the current cut was planned for, and the best cut at the measured speeds is at least
    ``min_gain`` (relative) faster than the current one, and strictly faster (so that
    ``min_gain=0`` never moves layers for nothing). ``sizes`` is kept otherwise."""
    if not (threshold >= 0 and 0 <= min_gain < 1):
        raise ValueError(f"replan_decision: threshold={threshold!r} must be >= 0 and "
                         f"min_gain={min_gain!r} in [0, 1)")  # fmt: skip
    _check(costs, measured)
    _check(costs, planned)
    drift = speed_drift(planned, measured)
    now = bottleneck(sizes, costs, measured)
    if drift <= threshold:
        return ReplanDecision(False, tuple(sizes), drift, now, now)
    best = balanced_sizes(costs, measured, prefer=sizes)
    then = bottleneck(best, costs, measured)
    if then >= now or then > now * (1 - min_gain):
        return ReplanDecision(False, tuple(sizes), drift, now, now)
    return ReplanDecision(True, best, drift, now, then)
