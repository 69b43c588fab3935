"""Perturbations and the static policy: seeded per-op jitter, stragglers, and the static
walk equal to the simulator when nothing is perturbed."""

from __future__ import annotations

import pytest

from nobubble.pipeline.actions import Action, Op
from nobubble.pipeline.costs import CostModel
from nobubble.pipeline.dispatch import (
    DISPATCH_POLICIES,
    Perturbation,
    Straggler,
    parse_straggler,
    simulate_dispatch,
)
from nobubble.pipeline.schedules import get_schedule
from nobubble.pipeline.simulate import simulate

COSTS = CostModel.from_rank_costs(4, t_f=2.0, t_b=1.5, t_w=1.0, t_comm=0.25)


def _all_actions(schedule):
    return [a for _, _, a in schedule.actions()]


@pytest.mark.parametrize("name", ["gpipe", "1f1b", "zb-h1", "zb-2p", "zb-v", "interleaved-1f1b",
                                  "dualpipev"])  # fmt: skip
def test_static_unperturbed_is_the_simulator_bit_for_bit(name) -> None:
    plan = get_schedule(name, num_ranks=4, num_microbatches=8, costs=COSTS)
    ref = simulate(plan, COSTS)
    got = simulate_dispatch(plan, COSTS)
    assert got.sim.start == ref.start and got.sim.end == ref.end
    assert got.summary() | ref.summary() == got.summary()  # every simulator key, same value
    assert got.peak_memory == ref.peak_memory and got.deviations == 0


def test_jitter_factors_stay_in_range_and_follow_the_seed() -> None:
    plan = get_schedule("zb-h1", num_ranks=4, num_microbatches=8)
    table = Perturbation(jitter=0.2, seed=5).durations(COSTS, plan.stage_to_rank, 8)
    factors = [table.of(a) / COSTS.duration(a) for a in _all_actions(plan)]
    assert all(0.8 - 1e-12 <= f <= 1.2 + 1e-12 for f in factors)
    assert len(set(factors)) == len(factors)  # one draw per op
    again = Perturbation(jitter=0.2, seed=5).durations(COSTS, plan.stage_to_rank, 8)
    other = Perturbation(jitter=0.2, seed=6).durations(COSTS, plan.stage_to_rank, 8)
    assert again == table and other != table
    next_step = Perturbation(jitter=0.2, seed=5).durations(COSTS, plan.stage_to_rank, 8, step=1)
    assert next_step != table


def test_a_straggler_slows_its_rank_in_its_steps_only() -> None:
    plan = get_schedule("zb-h1", num_ranks=4, num_microbatches=8)
    pert = Perturbation(stragglers=(Straggler(1, 1.5, first_step=2, last_step=3),))
    for step, slow in ((0, False), (2, True), (3, True), (4, False)):
        table = pert.durations(COSTS, plan.stage_to_rank, 8, step=step)
        for a in _all_actions(plan):
            factor = 1.5 if slow and a.stage == 1 else 1.0
            assert table.of(a) == pytest.approx(COSTS.duration(a) * factor)


def test_static_keeps_the_order_and_pays_the_straggler() -> None:
    plan = get_schedule("zb-h1", num_ranks=4, num_microbatches=8)
    slow = simulate_dispatch(
        plan, COSTS, perturbation=Perturbation(stragglers=(Straggler(2, 2.0),))
    )
    assert slow.schedule is plan
    assert slow.sim.busy[2] == pytest.approx(2 * simulate(plan, COSTS).busy[2])
    assert slow.makespan > simulate(plan, COSTS).makespan


def test_both_policies_meet_the_same_durations() -> None:
    """Paired comparison: the same op takes the same time under either policy."""
    plan = get_schedule("zb-2p", num_ranks=4, num_microbatches=8, costs=COSTS)
    pert = Perturbation(jitter=0.3, stragglers=(Straggler(3, 1.5),), seed=11)
    runs = [simulate_dispatch(plan, COSTS, policy=p, perturbation=pert) for p in DISPATCH_POLICIES]
    took = [
        {a: e - s for acts, ss, es in zip(r.schedule.rank_actions, r.sim.start, r.sim.end)
         for a, s, e in zip(acts, ss, es)}
        for r in runs
    ]  # fmt: skip
    assert took[0].keys() == took[1].keys()
    assert all(took[0][a] == pytest.approx(took[1][a]) for a in took[0])


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("1:1.5", Straggler(1, 1.5)),
        ("0:2:3", Straggler(0, 2.0, 0, 2)),
        ("2:1.25:4-6", Straggler(2, 1.25, 4, 6)),
        ("3:1.5:5-", Straggler(3, 1.5, 5, None)),
    ],
)
def test_parse_straggler(text, want) -> None:
    assert parse_straggler(text) == want
    assert parse_straggler(str(want)) == want


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("1", "expected RANK:FACTOR[:STEPS]"),
        ("a:1.5", "RANK 'a' is not an integer"),
        ("-1:1.5", "RANK -1 must be >= 0"),
        ("1:x", "FACTOR 'x' is not a number"),
        ("1:0", "FACTOR 0 must be finite and > 0"),
        ("1:inf", "must be finite"),
        ("1:nan", "must be finite"),
        ("1:1.5:0", "STEPS '0'"),
        ("1:1.5:4-2", "STEPS '4-2'"),
        ("1:1.5:2:3", "expected RANK:FACTOR[:STEPS]"),
    ],
)
def test_parse_straggler_refuses(text, fragment) -> None:
    with pytest.raises(ValueError, match=r"straggler '.*'") as err:
        parse_straggler(text)
    assert fragment in str(err.value)


@pytest.mark.parametrize("jitter", [-0.1, 1.0, 1.5, float("nan"), float("inf")])
def test_jitter_outside_zero_one_is_refused(jitter) -> None:
    with pytest.raises(ValueError, match="jitter=.* must be >= 0 and < 1"):
        Perturbation(jitter=jitter)


def test_a_straggler_outside_the_pipeline_is_refused() -> None:
    plan = get_schedule("zb-h1", num_ranks=4, num_microbatches=8)
    pert = Perturbation(stragglers=(Straggler(4, 1.5),))
    with pytest.raises(ValueError, match="rank 4 is outside ranks 0..3"):
        simulate_dispatch(plan, COSTS, perturbation=pert)


def test_fused_backward_has_its_own_draw() -> None:
    plan = get_schedule("1f1b", num_ranks=4, num_microbatches=8)
    table = Perturbation(jitter=0.2, seed=1).durations(COSTS, plan.stage_to_rank, 8)
    bw = Action(0, Op.BW, 0)
    assert 0.8 * COSTS.duration(bw) <= table.of(bw) <= 1.2 * COSTS.duration(bw)
