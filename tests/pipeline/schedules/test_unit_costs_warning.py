"""``get_schedule`` warns when a schedule whose order depends on the costs gets none."""

from __future__ import annotations

import random
import warnings

import pytest

from nobubble.pipeline.costs import CostModel
from nobubble.pipeline.schedules import (
    COST_DEPENDENT_SCHEDULES,
    SCHEDULE_NAMES,
    UnitCostsWarning,
    get_schedule,
)


def _unequal(p: int, seed: int) -> CostModel:
    rng = random.Random(seed)
    times = [tuple(rng.uniform(0.2, 2.0) for _ in range(p)) for _ in range(3)]
    return CostModel(t_f=times[0], t_b=times[1], t_w=times[2], mem_f=(1.0,) * p,
                     mem_b=(0.5,) * p, mem_w=(0.5,) * p, t_comm=rng.choice([0.0, 0.5]))  # fmt: skip


def _order(name: str, costs: CostModel | None):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UnitCostsWarning)
        return get_schedule(name, num_ranks=4, num_microbatches=8, costs=costs).rank_actions


@pytest.mark.parametrize("name", SCHEDULE_NAMES)
def test_the_warned_names_are_exactly_those_whose_order_moves_with_the_costs(name) -> None:
    unit = _order(name, None)
    moved = any(_order(name, _unequal(4, seed)) != unit for seed in range(8))
    assert moved == (name in COST_DEPENDENT_SCHEDULES)


def test_zb_2p_without_costs_warns_with_the_fix() -> None:
    with pytest.warns(UnitCostsWarning, match=r"zb-2p.*unit costs \(F = B = W = 1.*profile_mod"):
        get_schedule("zb-2p", num_ranks=4, num_microbatches=8)


@pytest.mark.parametrize(
    ("name", "costs"),
    [("zb-2p", CostModel.uniform(4)), ("v-zb", _unequal(4, 0)), ("1f1b", None), ("zb-h1", None)],
)
def test_no_warning_with_costs_or_for_a_fixed_order(name, costs) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # any warning fails the test
        get_schedule(name, num_ranks=4, num_microbatches=8, costs=costs)


def test_the_message_is_the_same_each_time_so_a_call_site_warns_once() -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")  # Python's own: once per message and line
        for _ in range(3):
            get_schedule("v-min", num_ranks=4, num_microbatches=8)
    assert [w.category for w in caught] == [UnitCostsWarning]
