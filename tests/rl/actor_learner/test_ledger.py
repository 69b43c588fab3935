"""The ledger: each trajectory used once or dropped for a stated reason, no gaps."""

from __future__ import annotations

import pytest

from nobubble.rl.actor_learner.ledger import LedgerError, TrajectoryLedger


def test_used_and_dropped_trajectories_make_a_whole_ledger() -> None:
    ledger = TrajectoryLedger()
    for seq in range(4):
        ledger.produced(("actor-0", seq))
    ledger.used(("actor-0", 0))
    ledger.used(("actor-0", 1))
    ledger.dropped(("actor-0", 2), "lag")
    ledger.dropped(("actor-0", 3), "shutdown")
    summary = ledger.check()
    assert (summary.produced, summary.used, summary.whole) == (4, 2, True)
    assert summary.dropped == {"lag": 1, "shutdown": 1}


def test_a_trajectory_cannot_be_used_twice_or_used_and_dropped() -> None:
    ledger = TrajectoryLedger()
    ledger.produced(("a", 0))
    ledger.used(("a", 0))
    with pytest.raises(LedgerError, match="is used; cannot mark it used"):
        ledger.used(("a", 0))
    with pytest.raises(LedgerError, match="cannot mark it dropped"):
        ledger.dropped(("a", 0), "lag")
    with pytest.raises(LedgerError, match="arrived twice"):
        ledger.produced(("a", 0))


def test_a_pending_or_lost_trajectory_breaks_the_ledger() -> None:
    ledger = TrajectoryLedger()
    ledger.produced(("a", 0))
    with pytest.raises(LedgerError, match="neither used nor dropped"):
        ledger.check()
    ledger.used(("a", 0))
    ledger.produced(("a", 2))  # seq 1 never arrived
    ledger.used(("a", 2))
    assert not ledger.summary().whole
    with pytest.raises(LedgerError, match="gaps"):
        ledger.check()
    with pytest.raises(ValueError, match="reason='late'"):
        ledger.dropped(("a", 2), "late")
