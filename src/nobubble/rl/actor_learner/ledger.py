"""The trajectory ledger: every trajectory is used once or dropped for a stated reason.

Lifecycle of a trajectory, keyed by ``(source, seq)``: ``PRODUCED -> USED`` (one learner
update consumed it) or ``PRODUCED -> DROPPED(reason)``. Reasons: ``lag`` (older than
``max_lag`` policy versions when the learner took it) and ``shutdown`` (made, but the run
ended before the learner could use it). The invariant :meth:`TrajectoryLedger.check`
asserts at the end of a run: nothing is used twice, nothing is used and dropped, nothing is
left ``PRODUCED``, and each source's sequence numbers have no gap (so no trajectory was lost
in transit).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

__all__ = ["DROP_REASONS", "LedgerError", "LedgerSummary", "TrajectoryLedger"]

DROP_REASONS: tuple[str, ...] = ("lag", "shutdown")


class LedgerError(RuntimeError):
    """A trajectory was used twice, lost, or left unaccounted for."""


@dataclass(frozen=True)
class LedgerSummary:
    """Counts at the end of a run.

    Attributes:
        produced: trajectories that reached the learner.
        used: consumed by exactly one update.
        dropped: by reason (``lag``, ``shutdown``).
        whole: every produced trajectory is used or dropped, none twice, no gaps.
    """

    produced: int
    used: int
    dropped: dict[str, int] = field(default_factory=dict)
    whole: bool = True

    def to_dict(self) -> dict[str, object]:
        return {
            "produced": self.produced,
            "used": self.used,
            "dropped": dict(self.dropped),
            "whole": self.whole,
        }


class TrajectoryLedger:
    """Records each trajectory's fate; one instance per run, owned by the learner."""

    def __init__(self) -> None:
        self._state: dict[tuple[str, int], str] = {}

    def produced(self, key: tuple[str, int]) -> None:
        if key in self._state:
            raise LedgerError(f"trajectory {key} arrived twice")
        self._state[key] = "produced"

    def _settle(self, key: tuple[str, int], state: str) -> None:
        now = self._state.get(key)
        if now != "produced":
            raise LedgerError(f"trajectory {key} is {now or 'unknown'}; cannot mark it {state}")
        self._state[key] = state

    def used(self, key: tuple[str, int]) -> None:
        self._settle(key, "used")

    def dropped(self, key: tuple[str, int], reason: str) -> None:
        if reason not in DROP_REASONS:
            raise ValueError(f"dropped: reason={reason!r}; use one of {DROP_REASONS}")
        self._settle(key, f"dropped:{reason}")

    def pending(self) -> list[tuple[str, int]]:
        return [k for k, s in self._state.items() if s == "produced"]

    def _gaps(self) -> list[str]:
        seqs: dict[str, list[int]] = {}
        for source, seq in self._state:
            seqs.setdefault(source, []).append(seq)
        return [s for s, v in seqs.items() if sorted(v) != list(range(len(v)))]

    def summary(self) -> LedgerSummary:
        counts = Counter(self._state.values())
        dropped = {r: counts.get(f"dropped:{r}", 0) for r in DROP_REASONS}
        whole = not self.pending() and not self._gaps()
        return LedgerSummary(len(self._state), counts.get("used", 0), dropped, whole)

    def check(self) -> LedgerSummary:
        """The summary, after asserting the invariant (raises :class:`LedgerError`)."""
        if self.pending():
            raise LedgerError(f"{len(self.pending())} trajectories neither used nor dropped")
        if self._gaps():
            raise LedgerError(f"sources {self._gaps()} have gaps in their trajectory numbers")
        return self.summary()
