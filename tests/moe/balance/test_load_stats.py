"""Live load statistics: moving window, cumulative totals, physical -> logical folding."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from nobubble.moe.balance.load_stats import ExpertLoadStats, logical_load


@settings(max_examples=60, deadline=None)
@given(
    st.integers(1, 5),
    st.lists(st.lists(st.integers(0, 100), min_size=3, max_size=3), min_size=1, max_size=12),
)
def test_moving_average_is_the_mean_of_the_last_window_steps(window, steps):
    stats = ExpertLoadStats(num_logical_experts=3, window=window)
    for i, load in enumerate(steps):
        stats.record(torch.tensor(load))
        recent = steps[max(0, i + 1 - window) : i + 1]
        expected = [sum(col) / len(recent) for col in zip(*recent)]
        assert stats.moving_average()[0].tolist() == pytest.approx(expected)
    assert stats.cumulative[0].tolist() == [sum(col) for col in zip(*steps)]


def test_logical_load_sums_replicas():
    phy2log = torch.tensor([2, 0, 2, 1, 0, 2])
    physical = torch.tensor([5, 1, 7, 3, 4, 0])
    assert logical_load(physical, phy2log, 3).tolist() == [5, 3, 12]


def test_bad_input():
    with pytest.raises(ValueError, match="window=0"):
        ExpertLoadStats(num_logical_experts=3, window=0)
    stats = ExpertLoadStats(num_logical_experts=3)
    with pytest.raises(ValueError, match="no step recorded"):
        stats.moving_average()
    with pytest.raises(ValueError, match=r"load shape \(1, 4\)"):
        stats.record(torch.ones(4))
    with pytest.raises(ValueError, match=">= 0"):
        stats.record(-torch.ones(3))
