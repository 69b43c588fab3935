"""Every generator yields a valid schedule for every size it accepts; shape-specific facts."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nobubble.pipeline.actions import Op
from nobubble.pipeline.costs import CostModel
from nobubble.pipeline.schedules import SCHEDULE_NAMES, get_schedule
from nobubble.pipeline.simulate import simulate
from nobubble.pipeline.validate import validate


@settings(max_examples=150, deadline=None)
@given(st.sampled_from(SCHEDULE_NAMES), st.integers(1, 16), st.integers(1, 64))
def test_every_generator_valid(name, p, m):
    try:
        sched = get_schedule(name, num_stages=p, num_microbatches=m, costs=CostModel.uniform(p))
    except ValueError as err:  # the only refusal: interleaved with m % p != 0
        assert name == "interleaved-1f1b" and m % p and "divisible" in str(err)
        return
    validate(sched)
    assert sched.num_ranks == p and sched.num_microbatches == m
    costs = CostModel.uniform(p, mem_f=2.0, mem_b=1.5, mem_w=0.5)
    result = simulate(sched, costs, check=False)
    if name in ("1f1b", "zb-h1", "zb-1p", "zb-v"):  # 1F1B's activation memory
        assert max(result.peak_memory) <= p * 2.0 + 1e-9
    if name in ("zb-h2", "zb-2p"):
        assert max(result.peak_memory) <= 2 * p * 2.0 + 1e-9
    if name == "gpipe":
        assert result.peak_memory[0] == pytest.approx(m * 2.0)


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 8), st.integers(0, 3), st.integers(2, 4),
       st.floats(0.5, 3.0), st.floats(0.5, 3.0), st.floats(0.5, 3.0))  # fmt: skip
def test_interleaved_bubble_closed_form(p, groups, v, f, b, w):
    """Megatron: interleaving v chunks cuts 1F1B's bubble to (p-1)(F+B+W)/v (T_comm = 0)."""
    m = p * (groups + 1)
    sched = get_schedule("interleaved-1f1b", num_stages=p, num_microbatches=m, num_chunks=v)
    r = simulate(sched, CostModel.uniform(p, t_f=f, t_b=b, t_w=w))
    assert r.bubble_time == pytest.approx((p - 1) * (f + b + w) / v, rel=1e-9, abs=1e-9)


@pytest.mark.parametrize(("p", "m"), [(2, 3), (4, 8), (4, 16), (8, 24), (8, 64)])
def test_zb_v_zero_bubble_at_1f1b_memory(p, m):
    """ZB-V with T_F = T_B = T_W, T_comm = 0: no bubble once m >= 2p - 1."""
    sched = get_schedule("zb-v", num_stages=p, num_microbatches=m)
    assert sched.stage_to_rank == tuple(range(p)) + tuple(reversed(range(p)))
    r = simulate(sched, CostModel.uniform(p, t_f=1.0, t_b=1.0, t_w=1.0))
    assert r.bubble_rate == pytest.approx(0.0, abs=1e-12)
    assert r.max_peak_memory_vs_1f1b <= 1.0 + 1e-9


def test_zb_auto_custom_limit_respected():
    p, m = 4, 16
    costs = CostModel.uniform(p, mem_f=1.0, mem_b=0.5, mem_w=0.5)
    for limit in (1.0, 2.5, 6.0):
        sched = get_schedule(
            "zb-1p", num_stages=p, num_microbatches=m, costs=costs, mem_limit=limit
        )
        assert max(simulate(sched, costs).peak_memory) <= limit + 1e-9
    bigger = simulate(get_schedule("zb-2p", num_stages=p, num_microbatches=m, costs=costs), costs)
    smaller = simulate(get_schedule("zb-1p", num_stages=p, num_microbatches=m, costs=costs), costs)
    assert bigger.bubble_rate <= smaller.bubble_rate


def test_split_and_fused_backward_forms():
    assert not get_schedule("1f1b", num_stages=3, num_microbatches=4).uses_split_backward
    zb = get_schedule("zb-h1", num_stages=3, num_microbatches=4)
    assert {a.op for acts in zb.rank_actions for a in acts} == {Op.F, Op.B, Op.W}


@pytest.mark.parametrize(
    ("kwargs", "msg"),
    [
        ({"name": "pipedream"}, "unknown schedule 'pipedream'"),
        ({"name": "1f1b", "num_ranks": 0}, "num_ranks=0"),
        ({"name": "1f1b", "num_stages": 3}, "num_ranks=4 and num_stages=3 disagree"),
        ({"name": "1f1b", "num_microbatches": -1}, "num_microbatches=-1"),
        ({"name": "interleaved-1f1b", "num_microbatches": 6}, r"divisible.*use m=8"),
        ({"name": "1f1b", "num_chunks": 2}, "num_chunks applies"),
        ({"name": "zb-h1", "mem_limit": 3.0}, "mem_limit applies"),
        (
            {"name": "zb-1p", "mem_limit": 0.5, "costs": CostModel.uniform(4)},
            "below one microbatch",
        ),
        ({"name": "zb-v", "num_chunks": 3}, "2 chunks"),
    ],
)
def test_bad_requests(kwargs, msg):
    args = {"num_ranks": 4, "num_microbatches": 8} | kwargs
    name = args.pop("name")
    with pytest.raises(ValueError, match=msg):
        get_schedule(name, **args)


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(SCHEDULE_NAMES), st.integers(1, 8), st.integers(1, 24))
def test_csv_round_trip_every_generator(name, p, m):
    from nobubble.pipeline.actions import Schedule

    if name == "interleaved-1f1b":
        m = p * max(1, m // p)
    sched = get_schedule(name, num_stages=p, num_microbatches=m, costs=CostModel.uniform(p))
    assert Schedule.from_csv(sched.to_csv(), name=sched.name) == sched


def test_num_stages_is_still_accepted_as_the_old_name_of_num_ranks():
    old = get_schedule("zb-h1", num_stages=3, num_microbatches=6)
    assert old == get_schedule("zb-h1", num_ranks=3, num_microbatches=6)
    assert old.num_ranks == 3
    interleaved = get_schedule("interleaved-1f1b", num_ranks=2, num_microbatches=4)
    assert (interleaved.num_ranks, interleaved.num_stages) == (2, 4)  # stages = ranks x chunks
