"""Staleness weights, policy lag and GRPO group versions."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from nobubble.rl.algo import check_group_versions, policy_lag, staleness_weight


def test_stated_weights() -> None:
    # The usual rule w = 1 / (1 + staleness).
    assert [staleness_weight(g) for g in (0, 1, 2, 3)] == [1.0, 0.5, 1 / 3, 0.25]
    assert [staleness_weight(g, "exp", half_life=2.0) for g in (0, 2, 4)] == [1.0, 0.5, 0.25]
    assert staleness_weight(7, "none") == 1.0
    w = staleness_weight(torch.tensor([0, 1, 4]))
    assert w.dtype.is_floating_point and w.tolist() == pytest.approx([1.0, 0.5, 0.2])


@settings(max_examples=60, deadline=None)
@given(st.floats(0, 100), st.floats(0, 100), st.sampled_from(["inverse", "exp"]))
def test_weights_in_unit_interval_and_decreasing(a, b, kind) -> None:
    lo, hi = min(a, b), max(a, b)
    w_lo, w_hi = staleness_weight(lo, kind), staleness_weight(hi, kind)
    assert 0 < w_hi <= w_lo <= 1
    assert staleness_weight(torch.tensor([lo], dtype=torch.float64), kind).item() == pytest.approx(
        w_lo
    )


def test_policy_lag_is_current_minus_sample_version() -> None:
    assert policy_lag([5, 4, 3, 1, 5], 5).tolist() == [0, 1, 2, 4, 0]


def test_grpo_groups_must_share_a_version() -> None:
    assert check_group_versions([2, 2, 3, 3, 3, 3], group_size=2).tolist() == [2, 3, 3]
    with pytest.raises(ValueError, match=r"group 1 mixes policy versions \[2, 3\]"):
        check_group_versions([2, 2, 2, 3], group_size=2)


def test_bad_input() -> None:
    with pytest.raises(ValueError, match="policy_version=6 > current_version=5"):
        policy_lag([6, 5], 5)
    with pytest.raises(ValueError, match="gap=-1"):
        staleness_weight(-1)
    with pytest.raises(ValueError, match="kind='linear'"):
        staleness_weight(1, "linear")
    with pytest.raises(ValueError, match="group_size=4"):
        check_group_versions([1, 1, 1], 4)
    assert math.isclose(staleness_weight(0.0), 1.0)


def test_the_trainer_config_offers_exactly_the_kinds_staleness_weight_takes() -> None:
    """``TrainerConfig`` (torch-free, so it cannot import the Literal) restates the kinds: a
    kind added or renamed on one side only would be refused by one and taken by the other."""
    from typing import get_args

    from nobubble.rl.algo.staleness import StalenessKind
    from nobubble.rl.system.config import STALENESS_WEIGHTS

    assert set(STALENESS_WEIGHTS) == set(get_args(StalenessKind))
    for kind in STALENESS_WEIGHTS:
        staleness_weight(1, kind)  # every kind the config accepts is one the loss takes
