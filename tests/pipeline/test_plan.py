"""The planner on synthetic block costs (no torch): brute force, determinism, JSON, refusals."""

from __future__ import annotations

import itertools
import json
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nobubble.pipeline import get_schedule, simulate
from nobubble.pipeline.partition import balanced_sizes
from nobubble.pipeline.plan import (
    BlockCosts,
    Plan,
    candidate_cuts,
    cuts_from_sizes,
    plan_from_costs,
    stage_costs,
)


def block(f: float, b: float | None = None, w: float | None = None, act: float = 100.0):
    """A block whose B and W default to its F (the paper's T_F = T_B = T_W)."""
    return BlockCosts(f, f if b is None else b, f if w is None else w, act, 10.0)


def step_ms(blocks, cuts, name, m, *, recompute=False):
    costs = stage_costs(blocks, cuts, recompute=recompute)
    schedule = get_schedule(name, num_ranks=len(cuts) + 1, num_microbatches=m, costs=costs)
    return simulate(schedule, costs).makespan


blocks_strategy = st.lists(
    st.builds(block, st.floats(0.1, 10), st.floats(0.1, 10), st.floats(0.1, 10)),
    min_size=1,
    max_size=12,
)


@settings(max_examples=40, deadline=None)
@given(blocks=blocks_strategy, num_ranks=st.integers(1, 4), m=st.integers(1, 8))
def test_cut_equals_brute_force_over_all_contiguous_cuts(blocks, num_ranks, m):
    if num_ranks > len(blocks):
        return
    plan = plan_from_costs(blocks, num_ranks=num_ranks, num_microbatches=m, schedules=["1f1b"],
                           recompute=False, tolerance=0.0)  # fmt: skip
    # brute force: every way to choose num_ranks - 1 cut points among the block boundaries
    every = {cuts: step_ms(blocks, cuts, "1f1b", m)
             for cuts in itertools.combinations(range(1, len(blocks)), num_ranks - 1)}  # fmt: skip
    best = min(every.values())
    assert plan.predicted_step_ms == best
    assert every[plan.cuts] == best  # one of the fastest cuts (ties: the least peak memory)


def test_neighbourhood_is_each_cut_point_moved_by_one_or_two():
    blocks = [block(1.0)] * 40
    dp = cuts_from_sizes(balanced_sizes([3.0] * 40, [1.0] * 4))
    assert dp == (10, 20, 30)
    got = candidate_cuts(blocks, 4, max_exhaustive_cuts=0)
    assert got[0] == dp
    moved = {dp[:k] + (dp[k] + d,) + dp[k + 1 :] for k in range(3) for d in (-2, -1, 1, 2)}
    assert set(got) == {dp} | moved and len(got) == 13


def test_neighbourhood_keeps_stages_non_empty():
    got = candidate_cuts([block(1.0)] * 4, 3, max_exhaustive_cuts=0)
    assert all(0 < a < b < 4 for a, b in got)


def test_first_stage_backward_is_all_weight_gradient():
    blocks = [block(1.0, 2.0, 3.0, act=50.0), block(1.0, 2.0, 3.0, act=50.0)]
    costs = stage_costs(blocks, (1,))
    assert costs.t_b[0] < 1e-3 and costs.t_w[0] == 5.0  # stage 0: B empty, W = B + W
    assert costs.mem_b[0] == 0.0 and costs.mem_w[0] == 50.0
    assert costs.t_b[1] == 2.0 and costs.t_w[1] == 3.0  # later stages: as measured
    with_grad = stage_costs(blocks, (1,), first_stage_input_grad=True)
    assert with_grad.t_b[0] == 2.0 and with_grad.t_w[0] == 3.0


def test_stage_costs_sum_blocks_and_scale():
    blocks = [block(1.0, act=10.0), block(2.0, act=20.0), block(4.0, act=40.0)]
    costs = stage_costs(blocks, (2,), scale=0.5, comm_ms_per_byte=0.1)
    assert costs.t_f == (1.5, 2.0) and costs.mem_f == (15.0, 20.0)
    assert costs.t_comm == pytest.approx(0.1 * 10.0 * 0.5)
    rc = stage_costs(blocks, (2,), recompute=True, input_bytes=3.0)
    assert rc.recompute_mem == (3.0, 10.0)  # stage input: the model input, then a boundary


def test_the_runtimes_cost_is_added_to_every_action_unscaled():
    blocks = [block(1.0), block(2.0), block(3.0)]
    bare = stage_costs(blocks, (1,), scale=2.0)
    paid = stage_costs(blocks, (1,), scale=2.0, op_overhead_ms=0.25)
    for field in ("t_f", "t_b", "t_w", "t_bw"):
        assert [b + 0.25 for b in getattr(bare, field)] == list(getattr(paid, field))
    assert (paid.mem_f, paid.t_comm) == (bare.mem_f, bare.t_comm)
    # a schedule of more actions pays it more often: ZB-H1 splits every backward in two
    plain = plan_from_costs(blocks, num_ranks=2, num_microbatches=4, schedules=["zb-h1"])
    costly = plan_from_costs(blocks, num_ranks=2, num_microbatches=4, schedules=["zb-h1"],
                             op_overhead_ms=0.25)  # fmt: skip
    assert costly.predicted_step_ms > plain.predicted_step_ms
    assert (
        costly.setting.op_overhead_ms
        == 0.25
        == Plan.from_json(costly.to_json()).setting.op_overhead_ms
    )


def test_within_the_tolerance_the_least_memory_wins():
    blocks = [block(1.0 + (i * 5 % 3)) for i in range(6)]
    exact = plan_from_costs(blocks, num_ranks=2, num_microbatches=8, tolerance=0.0)
    assert exact.chosen == exact.candidates[0]  # no tolerance: the fastest prediction
    loose = plan_from_costs(blocks, num_ranks=2, num_microbatches=8, tolerance=0.5)
    fastest = exact.predicted_step_ms
    dp_1f1b = next(c for c in loose.candidates if c.schedule == "1f1b"
                   and c.cuts == candidate_cuts(blocks, 2)[0])  # fmt: skip
    bound = min(fastest * 1.5, dp_1f1b.predicted_step_ms)
    near = [c for c in loose.candidates if c.predicted_step_ms <= bound]
    assert loose.predicted_step_ms <= bound  # never slower than 1F1B on the min-bottleneck cut
    assert max(loose.predicted_peak_bytes) == min(max(c.predicted_peak_bytes) for c in near)


def test_plan_is_deterministic_and_round_trips_json():
    blocks = [block(1.0 + (i * 7 % 5)) for i in range(8)]
    a = plan_from_costs(blocks, num_ranks=2, batch_size=16, microbatch_size=2)
    b = plan_from_costs(blocks, num_ranks=2, batch_size=16, microbatch_size=2)
    assert a == b
    assert Plan.from_json(a.to_json()) == a
    assert sum(a.stage_sizes()) == 8 and len(a.stage_sizes()) == len(a.cuts) + 1
    assert a.candidates[0].predicted_step_ms == a.predicted_step_ms


def test_plan_read_takes_the_written_plan_and_refuses_what_is_no_plan(tmp_path):
    plan = plan_from_costs([block(1.0 + i % 3) for i in range(6)], num_ranks=2, batch_size=8,
                           microbatch_size=2)  # fmt: skip
    (good := tmp_path / "plan.json").write_text(plan.to_json())
    assert Plan.read(good) == plan
    (folder := tmp_path / "folder").mkdir()
    cases = {
        tmp_path / "missing.json": "no such file; write one with pp plan",
        folder: "; write one with pp plan",
        tmp_path / "garbage.json": "not a plan JSON (pp plan --model ... --out): JSONDecodeError",
        tmp_path / "other.json": "not a plan JSON (pp plan --model ... --out): KeyError",
        tmp_path / "list.json": "not a plan JSON (pp plan --model ... --out): TypeError",
    }
    (tmp_path / "garbage.json").write_text("{not json")
    (tmp_path / "other.json").write_text('{"stages": []}')
    (tmp_path / "list.json").write_text("[1, 2]")
    for path, needle in cases.items():
        with pytest.raises(ValueError, match=re.escape(f"{path}: ")) as err:
            Plan.read(path)
        assert needle in str(err.value), (path, err.value)


def test_weigh_and_simulate_rebuild_every_candidate():
    blocks = [block(1.0 + (i * 3 % 4)) for i in range(6)]
    p = plan_from_costs(blocks, num_ranks=2, batch_size=8, microbatch_size=1,
                        memory_limit=1e9)  # fmt: skip
    for c in p.candidates:
        again = p.weigh(c.cuts, c.schedule, num_microbatches=c.num_microbatches,
                        recompute=c.recompute[0])  # fmt: skip
        assert again == c
        assert p.simulate(c).makespan == c.predicted_step_ms
        assert p.simulate(c).bubble_rate == c.predicted_bubble_rate  # carried, not redone
    assert p.simulate().makespan == p.predicted_step_ms
    # a cut the search need not have kept: 8 one-row microbatches are the profiled size
    assert p.weigh((3,), "1f1b", num_microbatches=8).predicted_step_ms == step_ms(
        blocks, (3,), "1f1b", 8
    )


def test_describe_is_the_candidates_row_and_draw_writes_plan_above_naive(tmp_path):
    # by hand: two blocks of F = B = W = 1 ms and 1 MiB of activations, one per rank, m = 2,
    # 1F1B with a fused backward BW of 2 ms. Rank 1: F0 1-2, BW0 2-4, F1 4-5, BW1 5-7; rank 0:
    # F0 0-1, F1 1-2, BW0 4-6 (after rank 1's BW0), BW1 7-9. Step 9 ms; the longest span (9)
    # less a rank's work (6) is the bubble, 1/3; rank 0 holds two microbatches (2 MiB),
    # rank 1 one (1 MiB)
    p = plan_from_costs([block(1.0, act=2.0**20)] * 2, num_ranks=2, num_microbatches=2,
                        memory_limit=1.5 * 2**20)  # fmt: skip
    row = p.describe(p.naive())
    assert row == {"stage_sizes": [1, 1], "schedule": "1f1b", "num_microbatches": 2,
                   "recompute": False, "predicted_step_ms": 9.0,
                   "bubble_rate": pytest.approx(1 / 3), "peak_mib_per_rank": [2.0, 1.0],
                   "fits": False}  # fmt: skip
    # with recompute a rank holds its input (10 B on rank 1) and, during a BW, 1 MiB again
    assert p.describe(p.weigh((1,), "1f1b", recompute=True))["fits"] is True
    png = p.draw(tmp_path / "plan.png")
    assert png == tmp_path / "plan.png" and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_plan_file_without_bubble_rates_is_described_by_simulating_again():
    p = plan_from_costs([block(1.0, act=2.0**20)] * 2, num_ranks=2, num_microbatches=2)
    old = json.loads(p.to_json())
    for c in (old["chosen"], *old["candidates"]):  # as written before the rates were kept
        del c["predicted_bubble_rate"]
    q = Plan.from_json(json.dumps(old))
    assert q.chosen.predicted_bubble_rate is None
    assert q.describe(q.chosen) == p.describe(p.chosen)


@pytest.mark.parametrize("cuts, schedule, message", [
    ((0,), "1f1b", "leave a stage"), ((4, 2), "1f1b", "leave a stage"),
    ((2, 4), "1f1b", "needs 2 stages"), ((3,), "zb-v", "needs 4 stages"),
    ((3,), "nope", "unknown schedule 'nope'"), ((1, 2, 3), "zb-v", "zb-v holds 2 stages"),
])  # fmt: skip
def test_weigh_refuses_a_cut_that_does_not_fit(cuts, schedule, message):
    p = plan_from_costs([block(1.0)] * (3 if schedule == "zb-v" and len(cuts) == 3 else 6),
                        num_ranks=2, num_microbatches=4)  # fmt: skip
    with pytest.raises(ValueError, match=message):
        p.weigh(cuts, schedule)


def test_weigh_refuses_a_microbatch_count_the_batch_cannot_take():
    p = plan_from_costs([block(1.0)] * 4, num_ranks=2, batch_size=8, num_microbatches=4,
                        microbatch_size=2)  # fmt: skip
    with pytest.raises(ValueError, match=r"not divisible by num_microbatches \[3\]"):
        p.weigh((2,), "1f1b", num_microbatches=3)
    with pytest.raises(ValueError, match="must be integers >= 1"):
        p.weigh((2,), "1f1b", num_microbatches=0)


def test_one_rank_weighs_no_two_stage_schedules():
    p = plan_from_costs([block(1.0)] * 4, num_ranks=1, num_microbatches=2)
    assert {c.schedule for c in p.candidates} == {"1f1b", "zb-h1", "zb-2p"}
    assert p.cuts == ()


def test_heavier_block_moves_the_cut():
    blocks = [block(1.0)] * 8
    before = plan_from_costs(blocks, num_ranks=2, num_microbatches=4, schedules="1f1b")
    assert before.cuts == (4,)
    heavier = [*blocks[:1], block(3.0), *blocks[2:]]
    after = plan_from_costs(heavier, num_ranks=2, num_microbatches=4, schedules="1f1b")
    assert after.cuts != before.cuts and after.cuts[0] < 4


def test_memory_limit_picks_a_plan_that_fits():
    blocks = [block(1.0 + i % 3, act=100.0) for i in range(8)]
    free = plan_from_costs(blocks, num_ranks=2, num_microbatches=8)
    limit = max(free.predicted_peak_bytes) * 0.7
    tight = plan_from_costs(blocks, num_ranks=2, num_microbatches=8, memory_limit=limit)
    assert max(tight.predicted_peak_bytes) <= limit
    assert (tight.cuts, tight.schedule_name, tight.recompute) != (free.cuts, free.schedule_name,
                                                              free.recompute)  # fmt: skip
    assert tight.predicted_step_ms >= free.predicted_step_ms


@settings(max_examples=15, deadline=None)
@given(blocks=blocks_strategy, num_ranks=st.integers(2, 3), m=st.sampled_from([4, 6]))
def test_never_slower_than_1f1b_on_the_dp_cut(blocks, num_ranks, m):
    if num_ranks > len(blocks):
        return
    dp = cuts_from_sizes(balanced_sizes([b.total_ms for b in blocks], [1.0] * num_ranks))
    for schedules in ("auto", ["zb-2p"]):
        plan = plan_from_costs(blocks, num_ranks=num_ranks, num_microbatches=m,
                               schedules=schedules, recompute=False)  # fmt: skip
        assert plan.predicted_step_ms <= step_ms(blocks, dp, "1f1b", m)


BAD = [
    (dict(blocks=[]), "no blocks"),
    (dict(num_ranks=0), "num_ranks=0"),
    (dict(num_ranks=5), "num_ranks=5 for 4 blocks"),
    (dict(num_microbatches=None, batch_size=11), "batch_size=11 has no divisor"),
    (dict(num_microbatches=3, batch_size=8), "not divisible by num_microbatches [3]"),
    (dict(num_microbatches=None), "give num_microbatches, or batch_size"),
    (dict(schedules=["1f1b", "zb-9"]), "unknown schedule 'zb-9'"),
    (dict(schedules="zb-v", num_ranks=3), "zb-v holds 2 stages per rank"),
    (dict(memory_limit=0.0), "memory_limit=0.0 must be > 0"),
    (dict(memory_limit=1.0), "no candidate fits memory_limit=1 bytes"),
    (dict(recompute="sometimes"), "recompute='sometimes'"),
    (dict(num_microbatches=[2, 4], batch_size=8), "no microbatch_size"),
    (dict(op_overhead_ms=-0.1), "op_overhead_ms=-0.1 must be finite and >= 0"),
    (dict(cuts=[(3, 1)]), "cuts (3, 1) for 4 blocks on 2 ranks"),
    (dict(cuts=[(4,)]), "cuts (4,) for 4 blocks on 2 ranks"),
    (dict(cuts=[(1, 2)]), "cuts (1, 2) for 4 blocks"),  # 3 stages on 2 ranks
    (dict(cuts=[(1, 2, 3)]), "no cut of 2 stages among cuts [(1, 2, 3)]"),
    (dict(cuts=[(2,)], schedules="zb-v"), "no cut of 4 stages"),
    (dict(ilp_time_limit_s=0.0), "ilp_time_limit_s=0.0 must be > 0 seconds"),
]


@pytest.mark.parametrize("num_microbatches", [4, 6])
def test_pinned_cuts_are_the_only_cuts_weighed(num_microbatches):
    """With ``cuts``, every schedule is weighed on those cuts alone (its stage count's), and
    each prediction is the simulator's on that cut: the search of the one planner, not a cut
    search."""
    blocks = [block(1.0 + (i * 5 % 3)) for i in range(8)]
    pinned = [(3,), (2, 4, 6)]
    plan = plan_from_costs(blocks, num_ranks=2, num_microbatches=num_microbatches,
                           schedules=["1f1b", "zb-h1", "zb-v"], cuts=pinned, tolerance=0.0)  # fmt: skip
    assert {(c.schedule, c.cuts) for c in plan.candidates} == {
        ("1f1b", (3,)), ("zb-h1", (3,)), ("zb-v", (2, 4, 6))}  # fmt: skip
    for c in plan.candidates:
        if c.schedule != "zb-v":
            assert c.predicted_step_ms == step_ms(
                blocks, c.cuts, c.schedule, num_microbatches, recompute=c.recompute[0]
            )
    assert plan.chosen == plan.candidates[0]


@pytest.mark.parametrize(("change", "message"), BAD, ids=[m for _, m in BAD])
def test_bad_input_is_refused_with_its_name(change, message):
    kwargs = dict(blocks=[block(1.0)] * 4, num_ranks=2, num_microbatches=4)
    kwargs.update(change)
    with pytest.raises(ValueError, match=re.escape(message)):
        plan_from_costs(**kwargs)


def test_negative_cost_is_refused():
    with pytest.raises(ValueError, match=r"BlockCosts.backward_input=-1.0 must be finite"):
        BlockCosts(1.0, -1.0, 1.0, 0.0, 0.0)


def test_smallest_peak_is_named_when_nothing_fits():
    with pytest.raises(ValueError, match=r"smallest predicted peak is \d+.*allow recompute"):
        plan_from_costs([block(1.0)] * 4, num_ranks=2, num_microbatches=4, memory_limit=1.0)


@pytest.mark.parametrize(("num_blocks", "num_ranks", "cuts"), [(6, 2, (3,)), (7, 3, (3, 5))])
def test_naive_is_1f1b_on_equal_block_counts(num_blocks, num_ranks, cuts):
    blocks = [block(1.0 + i) for i in range(num_blocks)]  # uneven: the plan's cut is not equal
    plan = plan_from_costs(blocks, num_ranks=num_ranks, num_microbatches=6, recompute="auto")
    naive = plan.naive()
    # equal counts, the first stages one block more when they do not divide (7 = 3 + 2 + 2)
    assert (naive.cuts, naive.schedule, naive.num_microbatches) == (cuts, "1f1b", 6)
    assert not any(naive.recompute)
    assert naive.predicted_step_ms == step_ms(blocks, cuts, "1f1b", 6)
    assert naive.predicted_step_ms >= plan.predicted_step_ms
