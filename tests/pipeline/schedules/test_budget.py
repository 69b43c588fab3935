"""The work budgets of a pipeline shape (nobubble.pipeline.schedules.budget)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nobubble.pipeline.schedules import get_schedule
from nobubble.pipeline.schedules.budget import (
    OPS_BUDGET,
    V_MEMORY_BUDGET,
    V_MEMORY_OPS,
    check_ops,
    num_ops,
)
from nobubble.pipeline.schedules.v_memory import V_MEMORY_NAMES


@pytest.mark.parametrize(("name", "chunks"), [("zb-h1", None), ("interleaved-1f1b", 2),
                                              ("interleaved-1f1b", 3), ("zb-v", None)])  # fmt: skip
def test_num_ops_counts_a_generated_schedule_at_most_two_chunks_unless_given(name, chunks):
    s = get_schedule(name, num_ranks=3, num_microbatches=6, num_chunks=chunks)
    counted = sum(len(row) for row in s.rank_actions)  # fused BW counts once: at most 3 per stage
    assert counted <= num_ops(3, 6, chunks)
    assert num_ops(3, 6, chunks) == 3 * 3 * (chunks or 2) * 6


@given(st.sampled_from(sorted(OPS_BUDGET)), st.integers(1, 10_000), st.integers(1, 10_000))
def test_check_ops_refuses_exactly_the_shapes_past_the_budget(budget, ranks, microbatches):
    past = 3 * ranks * 2 * microbatches > OPS_BUDGET[budget]  # independent count: 2 chunks
    if past:
        with pytest.raises(ValueError, match=f"{ranks} ranks x {microbatches} microbatches"):
            check_ops(ranks, microbatches, budget=budget)
    else:
        check_ops(ranks, microbatches, budget=budget)


@given(st.sampled_from([*V_MEMORY_NAMES, None]), st.integers(1, 200), st.integers(1, 200_000))
def test_check_ops_holds_the_v_generators_to_both_of_their_bounds(schedule, ranks, m):
    ops = 6 * ranks * m
    past_default = ops > OPS_BUDGET["default"]
    past_v = ops > V_MEMORY_OPS or ranks * ops > V_MEMORY_BUDGET
    if past_default or (schedule is not None and past_v):
        with pytest.raises(ValueError, match="budget"):
            check_ops(ranks, m, schedule=schedule)
    else:
        check_ops(ranks, m, schedule=schedule)
    if past_v and not past_default:
        with pytest.raises(ValueError, match="the V schedules"):
            check_ops(ranks, m, v_memory=True)


def test_check_ops_refuses_an_unknown_budget() -> None:
    with pytest.raises(KeyError):
        check_ops(2, 2, budget="nonesuch")
