"""When to re-cut: the re-plan policy over the stream of measured per-rank speeds (pure).

:class:`ReplanPolicy` is fed every step's speeds (:func:`~.partition.speeds_from_times`) and
answers the cut the next step should run with, or None. A cut's first step is warm-up and
unused; a step *drifts* when some rank's speed is more than ``threshold`` from the planned
one; after ``patience`` drifted steps in a row their median is the measured speed, the cut
changes when the best cut for it is at least ``min_gain`` faster
(:func:`~.partition.replan_decision`), and either way those speeds become the plan. Every
rank reaches the same answer from the same all-reduced numbers (rules: docs/pipeline/replan.md).
"""

from __future__ import annotations

import statistics
from collections import deque
from collections.abc import Sequence

from nobubble.pipeline.runtime.elastic.partition import replan_decision, speed_drift

__all__ = ["ReplanPolicy"]


class ReplanPolicy:
    """The re-plan decision over a run's steps (see the module docstring).

    Args:
        costs: each layer's nominal cost, in pipeline order.
        threshold: relative speed change that counts as drift (>= 0).
        min_gain: least relative gain of the new cut's bottleneck, in [0, 1).
        patience: drifted steps in a row before a decision (>= 1).
        replan: False observes and never answers a new cut (the static baseline).
        window: steady steps whose median is the plan (>= 1).
    """

    def __init__(
        self,
        costs: Sequence[float],
        *,
        threshold: float = 0.2,
        min_gain: float = 0.05,
        patience: int = 2,
        replan: bool = True,
        window: int = 5,
    ) -> None:
        if not (threshold >= 0 and 0 <= min_gain < 1 and patience >= 1 and window >= 1):
            raise ValueError(f"ReplanPolicy: threshold={threshold!r} must be >= 0, "
                             f"min_gain={min_gain!r} in [0, 1), patience={patience!r} and "
                             f"window={window!r} >= 1")  # fmt: skip
        self.costs = tuple(float(c) for c in costs)
        self.threshold, self.min_gain, self.replan = threshold, min_gain, replan
        self.patience = int(patience)
        self._steady: deque[tuple[float, ...]] = deque(maxlen=int(window))
        self._drifted: deque[tuple[float, ...]] = deque(maxlen=self.patience)
        self._warm = True

    def restart(self) -> None:
        """A new cut or runner starts: its first step is warm-up."""
        self._warm = True
        self._drifted.clear()

    def planned(self, speeds: Sequence[float]) -> tuple[float, ...]:
        """The speeds the current cut is planned for (equal at ``speeds``' mean at first)."""
        if self._steady:
            return _median_rows(self._steady)
        return (statistics.fmean(speeds),) * len(speeds)

    def observe(self, sizes: Sequence[int], speeds: Sequence[float]) -> tuple[int, ...] | None:
        """One step's measured speeds under the cut ``sizes``: the next step's cut, or None."""
        speeds = tuple(speeds)
        if self._warm:
            self._warm = False
            return None
        planned = self.planned(speeds)
        if speed_drift(planned, speeds) <= self.threshold:
            self._steady.append(speeds)
            self._drifted.clear()
            return None
        self._drifted.append(speeds)
        if len(self._drifted) < self.patience or not self.replan:
            return None
        measured = _median_rows(self._drifted)
        d = replan_decision(sizes, self.costs, planned, measured,
                            threshold=self.threshold, min_gain=self.min_gain)  # fmt: skip
        self._steady.clear()
        self._steady.append(measured)  # the speeds the new cut (or the kept one) is for
        self._drifted.clear()
        return d.sizes if d.replan else None


def _median_rows(rows: Sequence[tuple[float, ...]]) -> tuple[float, ...]:
    return tuple(statistics.median(col) for col in zip(*rows, strict=True))
