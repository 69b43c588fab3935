"""The handshake dispatch policy: deadlock-free, within its memory limit, a valid order, and
never later than the static order when the costs are exact.

Exhaustive over every pipeline with p <= 3 ranks and m <= 4 microbatches, five plans, three
cost shapes, two memory limits and three perturbations; then hypothesis on random costs.
"""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nobubble.pipeline.actions import Op
from nobubble.pipeline.costs import CostModel
from nobubble.pipeline.dispatch import (
    HandshakeRule,
    Perturbation,
    Straggler,
    choose_op,
    plan_peaks,
    run_handshake,
    simulate_dispatch,
)
from nobubble.pipeline.schedules import get_schedule
from nobubble.pipeline.simulate import run_timeline
from nobubble.pipeline.validate import validate

PLANS = ("1f1b", "zb-h1", "zb-h2", "zb-2p", "zb-v")
COSTS = {  # per rank: (t_f, t_b, t_w, t_comm, mem_b of mem_f = 1)
    "unit": (1.0, 1.0, 1.0, 0.0, 0.5),
    "paper-like": (1.0, 1.0, 0.5, 0.05, 0.63),
    "w-heavy, slow links": (1.0, 0.5, 2.0, 0.7, 0.2),
}


def _costs(p: int, shape: str) -> CostModel:
    t_f, t_b, t_w, t_comm, mem_b = COSTS[shape]
    return CostModel.uniform(p, t_f=t_f, t_b=t_b, t_w=t_w, t_comm=t_comm, mem_b=mem_b)


def _perturbations(p: int) -> list[Perturbation]:
    return [
        Perturbation(),
        Perturbation(jitter=0.5, seed=7),
        Perturbation(jitter=0.1, stragglers=(Straggler(p // 2, 2.5),), seed=1),
    ]


def _end_of(result) -> dict:
    return {
        a: result.sim.end[r][k]
        for r, acts in enumerate(result.schedule.rank_actions)
        for k, a in enumerate(acts)
    }


def _check(plan, costs, perturbation, mem_limit=None) -> None:
    """The handshake's contract on one case (each line one claim of the module docstring)."""
    result = simulate_dispatch(
        plan, costs, policy="handshake", perturbation=perturbation, mem_limit=mem_limit
    )
    executed = result.schedule
    validate(executed)  # a valid order: complete, runnable, replayable
    assert sorted(a for _, _, a in executed.actions()) == sorted(a for _, _, a in plan.actions())
    for r, (peak, limit) in enumerate(zip(result.peak_memory, result.limits)):
        assert peak <= limit * (1 + 1e-9), (r, peak, limit)
    assert all(b >= a - 1e-12 for a, b in zip(plan_peaks(plan, result.sim.costs), result.limits))
    if perturbation.is_identity:  # exact estimates: no op ends later than in the static run
        static = _end_of(simulate_dispatch(plan, costs))
        for action, end in _end_of(result).items():
            assert end <= static[action] + 1e-9, (action, end, static[action])
        assert result.bubble_rate <= simulate_dispatch(plan, costs).bubble_rate + 1e-12


CASES = [
    (p, m, name, shape)
    for p, m in itertools.product(range(1, 4), range(1, 5))
    for name in PLANS
    for shape in COSTS
]


@pytest.mark.parametrize(("p", "m", "name", "shape"), CASES, ids=lambda v: str(v))
def test_exhaustive_small_pipelines(p: int, m: int, name: str, shape: str) -> None:
    costs = _costs(p, shape)
    plan = get_schedule(name, num_ranks=p, num_microbatches=m, costs=costs)
    for perturbation in _perturbations(p):
        _check(plan, costs, perturbation)
        _check(plan, costs, perturbation, mem_limit=2 * p * costs.mem_f[0] + 1)


costs_st = st.floats(0.1, 5.0, allow_nan=False)


@settings(max_examples=60, deadline=None)
@given(
    st.sampled_from(["1f1b", "zb-h1", "zb-h2", "zb-1p", "zb-2p", "zb-v", "interleaved-1f1b"]),
    st.integers(1, 4),
    st.integers(1, 8),
    st.floats(0.0, 0.9),
    st.integers(0, 3),
    st.data(),
)
def test_random_costs_and_perturbations(name, p, m, jitter, seed, data) -> None:
    if name == "interleaved-1f1b":
        m = p * max(1, m // p)
    draw = data.draw
    mem_b = draw(st.floats(0.0, 2.0))
    costs = CostModel(
        t_f=[draw(costs_st) for _ in range(p)], t_b=[draw(costs_st) for _ in range(p)],
        t_w=[draw(costs_st) for _ in range(p)], t_comm=draw(st.floats(0.0, 2.0)),
        mem_f=[2.0] * p, mem_b=[mem_b] * p, mem_w=[2.0 - mem_b] * p,
    )  # fmt: skip
    plan = get_schedule(name, num_ranks=p, num_microbatches=m, costs=costs)
    stragglers = tuple(
        Straggler(draw(st.integers(0, p - 1)), draw(st.floats(0.2, 4.0)))
        for _ in range(draw(st.integers(0, 2)))
    )
    _check(plan, costs, Perturbation())
    _check(plan, costs, Perturbation(jitter=jitter, stragglers=stragglers, seed=seed))


def test_a_straggler_is_fed_around() -> None:
    """ZB-H1, p=6, m=8, rank 3 half as slow again: the handshake reorders and ends sooner."""
    costs = _costs(6, "paper-like")
    plan = get_schedule("zb-h1", num_ranks=6, num_microbatches=8)
    slow = Perturbation(stragglers=(Straggler(3, 1.5),))
    static = simulate_dispatch(plan, costs, perturbation=slow)
    handshake = simulate_dispatch(plan, costs, policy="handshake", perturbation=slow)
    assert handshake.deviations > 0
    assert handshake.makespan < static.makespan
    assert handshake.bubble_rate < static.bubble_rate


def test_describe_names_the_policy_the_perturbation_and_the_limits_in_m_f() -> None:
    costs = CostModel.uniform(4)  # mem_f 1 per rank: limits read in M_F as given
    plan = get_schedule("1f1b", num_ranks=4, num_microbatches=8)
    pert = Perturbation(jitter=0.2, stragglers=(Straggler(1, 1.5),), seed=7)
    static = simulate_dispatch(plan, costs, perturbation=pert)
    assert static.describe(1.0) == "static, jitter 0.2, straggler 1:1.5, seed 7"
    hs = simulate_dispatch(plan, costs, policy="handshake", mem_limit=6.0, perturbation=pert)
    assert hs.describe(2.0) == f"handshake, jitter 0.2, straggler 1:1.5, seed 7, limit 3 M_F, " \
        f"{hs.deviations} deviations"  # fmt: skip
    ragged = simulate_dispatch(plan, costs, policy="handshake", mem_limit=[4.0, 5.0, 6.0, 4.0])
    assert ragged.describe(1.0) == f"handshake, limits up to 6 M_F, {ragged.deviations} deviations"


def test_replaying_the_executed_order_is_never_later() -> None:
    """The executed order is a plan of its own: walking it statically starts every op no
    later than the handshake did (the handshake may have waited on an estimate)."""
    costs = _costs(3, "w-heavy, slow links")
    plan = get_schedule("zb-2p", num_ranks=3, num_microbatches=6, costs=costs)
    durations = Perturbation(jitter=0.4, seed=3).durations(costs, plan.stage_to_rank, 6)
    run = run_handshake(plan, costs, limits=plan_peaks(plan, costs), duration=durations.of)
    start, _ = run_timeline(run.schedule, durations.of, costs.t_comm)
    for r in range(3):
        assert all(a <= b + 1e-9 for a, b in zip(start[r], run.start[r]))


def test_window_zero_is_the_static_order() -> None:
    costs = _costs(3, "paper-like")
    plan = get_schedule("zb-h1", num_ranks=3, num_microbatches=4)
    pert = Perturbation(jitter=0.3, seed=2)
    frozen = simulate_dispatch(
        plan, costs, policy="handshake", perturbation=pert, rule=HandshakeRule(window=0)
    )
    assert frozen.schedule.rank_actions == plan.rank_actions and frozen.deviations == 0
    assert frozen.sim.end == simulate_dispatch(plan, costs, perturbation=pert).sim.end


def test_fused_backward_plans_run_too() -> None:
    plan = get_schedule("1f1b", num_ranks=3, num_microbatches=5)
    result = simulate_dispatch(plan, _costs(3, "unit"), policy="handshake",
                               perturbation=Perturbation(jitter=0.5, seed=1))  # fmt: skip
    assert {a.op for _, _, a in result.schedule.actions()} == {Op.F, Op.BW}


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"policy": "eager"}, "unknown dispatch policy 'eager'"),
        ({"policy": "handshake", "mem_limit": 1.0}, "below the peak"),
        ({"policy": "handshake", "mem_limit": [9.0, 9.0]}, "one per rank (3)"),
        ({"mem_limit": 9.0}, "apply to the handshake policy"),
    ],
)
def test_bad_arguments_name_the_fix(kwargs, fragment) -> None:
    plan = get_schedule("zb-h1", num_ranks=3, num_microbatches=4)
    with pytest.raises(ValueError) as err:
        simulate_dispatch(plan, _costs(3, "unit"), **kwargs)
    assert fragment in str(err.value)


@pytest.mark.parametrize(
    ("field", "value"), [("window", -1), ("profile_weight", 1.5), ("bottleneck_margin", -0.1)]
)
def test_rule_fields_are_checked(field, value) -> None:
    with pytest.raises(ValueError, match=f"HandshakeRule.{field}"):
        HandshakeRule(**{field: value})


def test_recompute_costs_keep_the_simulators_memory_and_the_handshake_refuses_them() -> None:
    """Static dispatch reports the peak the simulator does, the recompute transient
    included; the handshake's memory rule (only F adds) does not hold there, so it refuses."""
    from nobubble.pipeline.simulate import simulate

    plan = get_schedule("1f1b", num_ranks=4, num_microbatches=8)
    costs = CostModel.uniform(4).with_recompute(0.05)
    got = simulate_dispatch(plan, costs, policy="static")
    assert got.sim.peak_memory == simulate(plan, costs).peak_memory
    assert max(got.sim.peak_memory) > 4 * 0.05  # the rebuilt forward during B is counted
    with pytest.raises(ValueError, match="recompute"):
        simulate_dispatch(plan, costs, policy="handshake")


def test_the_rule_runs_the_head_else_b_then_the_next_f_then_w() -> None:
    """choose_op, the one rule the simulator and the runtime call, on a hand-made plan row."""
    F, B, W = Op.F, Op.B, Op.W
    ops = [F, B, W, F, F, W, B]  # head 0; the next F is position 3 (0 not done: the head)
    done = [False] * len(ops)

    def only(*ok: int):
        return lambda j: j in ok

    assert choose_op(ops, 0, 0, done, only(0, 1, 2, 3, 6)) == 0  # the head, when runnable
    assert choose_op(ops, 0, 3, done, only(2, 3, 5, 6)) == 6  # B first, wherever it is
    assert choose_op(ops, 0, 3, done, only(2, 3, 4, 5)) == 3  # then the plan's next F
    assert choose_op(ops, 0, 3, done, only(2, 4, 5)) == 2  # not a later F; then the first W
    assert choose_op(ops, 0, 3, done, only()) is None  # nothing: wait
    assert choose_op(ops, 0, 3, done, only(2, 6), window=3) == 2  # B at 6 is past the window
    assert choose_op(ops, 0, 3, done, only(2, 6), in_time=lambda j: j != 6) == 2  # B overruns
    done[6] = True
    assert choose_op(ops, 0, 3, done, only(2, 6)) == 2  # a position that ran is not rerun
