"""The event-driven simulator against a slow fixed-point reference and the closed forms."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nobubble.pipeline.actions import Action, Op, Schedule
from nobubble.pipeline.costs import CostModel, transformer_memory
from nobubble.pipeline.schedules import get_schedule
from nobubble.pipeline.simulate import simulate
from nobubble.pipeline.validate import ScheduleError

from .reference_sim import reference_times

costs_st = st.floats(0.1, 10.0, allow_nan=False)


def _random_costs(p, data, comm=True):
    draw = data.draw
    return CostModel(
        t_f=[draw(costs_st) for _ in range(p)],
        t_b=[draw(costs_st) for _ in range(p)],
        t_w=[draw(costs_st) for _ in range(p)],
        t_comm=draw(st.floats(0.0, 2.0)) if comm else 0.0,
        mem_f=[2.0] * p,
        mem_b=[1.5] * p,
        mem_w=[0.5] * p,
    )


@settings(max_examples=40, deadline=None)
@given(
    st.sampled_from(["gpipe", "1f1b", "zb-h1", "zb-h2", "interleaved-1f1b"]),
    st.integers(1, 5),
    st.integers(1, 10),
    st.data(),
)
def test_matches_fixed_point_reference(name, p, m, data):
    if name == "interleaved-1f1b":
        m = p * max(1, m // p)
    sched = get_schedule(name, num_stages=p, num_microbatches=m)
    costs = _random_costs(sched.num_stages, data)
    result = simulate(sched, costs)
    ref = reference_times(sched, costs)
    for r, acts in enumerate(sched.rank_actions):
        for k, a in enumerate(acts):
            assert result.start[r][k] == pytest.approx(ref[a][0])
            assert result.end[r][k] == pytest.approx(ref[a][1])


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 8), st.integers(0, 24), costs_st, costs_st, costs_st)
def test_closed_forms(p, extra, f, b, w):
    """T_comm = 0, m >= p: 1F1B idles (p-1)(F+B+W); ZB-H1 (p-1)(F+B-W) when W <= F, B."""
    m = p + extra
    costs = CostModel.uniform(p, t_f=f, t_b=b, t_w=w)
    r = simulate(get_schedule("1f1b", num_stages=p, num_microbatches=m), costs)
    assert r.bubble_time == pytest.approx((p - 1) * (f + b + w), rel=1e-9, abs=1e-9)
    if w <= f and w <= b:
        r = simulate(get_schedule("zb-h1", num_stages=p, num_microbatches=m), costs)
        assert r.bubble_time == pytest.approx((p - 1) * (f + b - w), rel=1e-9, abs=1e-9)


def test_seed_1f1b_bubble_ratio():
    """The textbook case: P=4, M=8 -> 1F1B bubble (P-1)/M of the ideal time, 37.5%."""
    r = simulate(get_schedule("1f1b", num_stages=4, num_microbatches=8), CostModel.uniform(4))
    assert r.bubble_time / max(r.busy) == pytest.approx(3 / 8)


def test_memory_peaks_counted_independently():
    p, m = 4, 8
    mem = transformer_memory(hidden=2304, heads=24, seq=1024)
    costs = CostModel.uniform(p, mem_f=mem.mem_f, mem_b=mem.mem_b, mem_w=mem.mem_w)
    for name in ("1f1b", "zb-h1", "zb-h2", "gpipe"):
        sched = get_schedule(name, num_stages=p, num_microbatches=m)
        r = simulate(sched, costs)
        for rank, acts in enumerate(sched.rank_actions):
            # brute force: after each prefix, count live activations by what was freed
            best = 0.0
            for k in range(len(acts) + 1):
                done = acts[:k]
                fs = sum(1 for a in done if a.op is Op.F)
                bs = sum(1 for a in done if a.op in (Op.B, Op.BW))
                ws = sum(1 for a in done if a.op in (Op.W, Op.BW))
                best = max(best, fs * mem.mem_f - bs * mem.mem_b - ws * mem.mem_w)
            assert r.peak_memory[rank] == pytest.approx(best)
        assert r.peak_memory_1f1b[0] == pytest.approx(p * mem.mem_f)
    one = simulate(get_schedule("1f1b", num_stages=p, num_microbatches=m), costs)
    assert one.peak_memory_vs_1f1b == pytest.approx((1.0,) * p)


def test_comm_only_across_ranks():
    # two stages on one rank: no transfer time between them
    sched = Schedule.from_rank_actions([["0F0", "1F0", "1B0", "0B0"]], stage_to_rank=[0, 0])
    costs = CostModel.uniform(2, t_comm=100.0)
    assert simulate(sched, costs).makespan == pytest.approx(2 * 1 + 2 * 2)
    sched2 = Schedule.from_rank_actions([["0F0", "0B0"], ["1F0", "1B0"]])
    assert simulate(sched2, costs).makespan == pytest.approx(6 + 200)


def test_rank_level_costs_split_over_chunks():
    sched = get_schedule("interleaved-1f1b", num_stages=2, num_microbatches=2, num_chunks=2)
    rank_costs = CostModel.uniform(2, t_f=2.0, t_b=2.0, t_w=2.0)
    r = simulate(sched, rank_costs)
    assert r.busy == pytest.approx((2 * 6.0, 2 * 6.0))  # m * (F+B+W) per rank


def test_deadlock_named():
    sched = Schedule.from_rank_actions([["0F0", "0B0"], ["1B0", "1F0"]])
    with pytest.raises(ScheduleError, match="rank 1: 1B0 waits for F of stage 1 microbatch 0"):
        simulate(sched, CostModel.uniform(2))


def test_cost_stage_count_mismatch():
    sched = get_schedule("1f1b", num_stages=3, num_microbatches=3)
    with pytest.raises(ValueError, match="costs have 2 stages"):
        simulate(sched, CostModel.uniform(2))


def test_action_timing_lookup():
    sched = get_schedule("1f1b", num_stages=2, num_microbatches=2)
    r = simulate(sched, CostModel.uniform(2, t_comm=0.5))
    assert r.timing(Action(1, Op.F, 0)) == pytest.approx((1.5, 2.5))


@pytest.mark.parametrize("name", ["1f1b", "zb-h1", "zb-2p", "interleaved-1f1b"])
def test_recompute_memory_and_time_counted_from_live_tensors(name):
    """Activation checkpointing, brute force over what lives on each rank: F keeps only its
    input; B first rebuilds the whole forward (mem_f on top of what was there), frees what
    only B needed and keeps what W needs; W (or a fused BW) frees the rest and the input.
    Every B/BW also runs F's time once more; nothing else changes."""
    p, m, x = 4, 8, 0.05
    chunks = 2 if name == "interleaved-1f1b" else 1
    kwargs = {"num_chunks": chunks} if chunks > 1 else {}
    sched = get_schedule(
        name, num_stages=p, num_microbatches=m, costs=CostModel.uniform(p), **kwargs
    )
    plain = CostModel.from_rank_costs(p, num_chunks=chunks, t_f=1.0, t_b=1.2, t_w=0.7,
                                      mem_f=1.0, mem_b=0.4, mem_w=0.6)  # fmt: skip
    rec = plain.with_recompute(x)
    r, base = simulate(sched, rec), simulate(sched, plain)
    per_stage_mf = 1.0 / chunks
    for rank, acts in enumerate(sched.rank_actions):
        live: dict[tuple[int, int], float] = {}  # (stage, mb) -> bytes held for backward
        best = 0.0
        for a in acts:
            key = (a.stage, a.microbatch)
            if a.op is Op.F:
                live[key] = x
            elif a.op in (Op.B, Op.BW):
                best = max(best, sum(live.values()) + per_stage_mf)  # rebuilt forward
                if a.op is Op.B:
                    live[key] = x + 0.6 / chunks  # W's inputs and the stage input stay
                else:
                    del live[key]
            else:
                del live[key]
            best = max(best, sum(live.values()))
        assert not live
        assert r.peak_memory[rank] == pytest.approx(best)
        if name in ("1f1b", "interleaved-1f1b") and rank == 0:  # many in flight: it pays
            assert r.peak_memory[rank] < base.peak_memory[rank]
        n_back = sum(1 for a in acts if a.op in (Op.B, Op.BW))
        assert r.busy[rank] == pytest.approx(base.busy[rank] + n_back * per_stage_mf)
    assert r.peak_memory_1f1b == base.peak_memory_1f1b  # the reference stays 1F1B's own
    assert r.makespan > base.makespan


def test_recompute_rejects_bad_input_memory():
    with pytest.raises(ValueError, match="stage_input_mem"):
        CostModel.uniform(2).with_recompute([0.1, 0.1, 0.1])
    with pytest.raises(ValueError, match="recompute_mem\\[0\\]=-1"):
        CostModel.uniform(2).with_recompute(-1.0)
