"""The re-plan's arithmetic (pure, no torch): :func:`speeds_from_times` turns measured per-rank
compute times into speeds (ms per unit of layer cost; a 1.5x straggler has speed 1.5),
:func:`replan_decision` says whether a new cut is worth moving layers for;
:func:`balanced_sizes` (from :mod:`nobubble.pipeline.partition`) is re-exported. The same
numbers give the same answer on every rank, so all switch together without a message.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from nobubble.pipeline.partition import balanced_sizes, bottleneck, held_costs
from nobubble.pipeline.partition import check_costs_and_speeds as _check
from nobubble.validation import finite

__all__ = ["balanced_sizes", "bottleneck", "held_costs", "speeds_from_times", "speed_drift",
           "ReplanDecision", "replan_decision"]  # fmt: skip


def speeds_from_times(
    times_ms: Sequence[float], sizes: Sequence[int], costs: Sequence[float]
) -> tuple[float, ...]:
    """Each rank's speed (ms per unit of cost) from its measured compute time in one step
    (``times_ms[r]``, waits excluded) and the layers it held (``sizes``)."""
    if len(times_ms) != len(sizes):
        raise ValueError(f"speeds_from_times: {len(times_ms)} times for {len(sizes)} ranks; "
                         "give one time per rank")  # fmt: skip
    for r, t in enumerate(times_ms):
        if not (finite(t) and t > 0):
            raise ValueError(f"speeds_from_times: rank {r}'s time is {t!r} ms; it must be "
                             "finite and > 0 (a rank that ran no op has no speed)")  # fmt: skip
    return tuple(t / c for t, c in zip(times_ms, held_costs(sizes, costs), strict=True))


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
