"""The CP-SAT model's optimum equals an exhaustive search over every valid schedule."""

from __future__ import annotations

import functools

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from ortools.sat.python import cp_model

from nobubble.pipeline.ilp.model import (
    IntProblem,
    asap_times,
    build_cpsat,
    objective_of,
    peak_memory,
    relabel_in_order,
)

from .ilp_bruteforce import Problem, all_orders
from .ilp_bruteforce import search as _search

UNIFORM = {"t_f": (10, 10, 10), "t_b": (10, 10, 10), "t_w": (5, 5, 5)}
search = functools.lru_cache(maxsize=None)(_search)  # the same cases recur across tests

SKEWED = {"t_f": (10, 13, 7), "t_b": (11, 9, 14), "t_w": (4, 8, 6)}  # per-stage costs differ


def _problems(p, m, costs, t_comm, limit, objective):
    kw = {k: v[:p] for k, v in costs.items()}
    mem = {"mem_f": (34,) * p, "mem_b": (2,) * p, "mem_w": (32,) * p}
    brute = Problem(p, m, **kw, t_comm=t_comm, **mem, mem_limit=limit, objective=objective)
    model = IntProblem(
        num_stages=p, num_microbatches=m, **kw, t_comm=t_comm,
        mem_f=mem["mem_f"], mem_b=(-2,) * p, mem_w=(-32,) * p, mem_limit=limit, objective=objective,
    )  # fmt: skip
    return brute, model


def _solve(problem: IntProblem, memory: str = "reservoir"):
    built = build_cpsat(problem, memory=memory)
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = 20.0
    solver.parameters.num_workers = 2
    code = solver.solve(built.model)
    return code, solver, built


def _orders(solver, built, p, m):
    out = []
    for s in range(p):
        ops = sorted((solver.value(built.start[op, s, i]), op, i) for op in "FBW" for i in range(m))
        out.append([(op, i) for _, op, i in ops])
    return out


_PROOF = pytest.mark.long  # the solver proves optimality: seconds each, the long tier

LIMITED = (2, 3, UNIFORM, 1, 68, "span")

CASES = [
    # (p, m, costs, t_comm, mem limit, objective)
    (2, 1, UNIFORM, 1, None, "span"),
    (2, 2, UNIFORM, 1, None, "span"),
    (2, 3, UNIFORM, 1, None, "span"),
    pytest.param(LIMITED, marks=_PROOF),  # two microbatches' activations
    (2, 3, SKEWED, 2, None, "makespan"),
    (2, 3, SKEWED, 0, 34, "span"),  # one microbatch in flight at a time
    (3, 3, UNIFORM, 1, None, "span"),
    (3, 3, SKEWED, 1, None, "span"),
    (3, 3, SKEWED, 1, 68, "span"),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"p{c[0]}m{c[1]}-c{c[3]}-lim{c[4]}-{c[5]}")
def test_solver_optimum_equals_exhaustive_search(case):
    p, m, costs, t_comm, limit, objective = case
    brute, problem = _problems(p, m, costs, t_comm, limit, objective)
    best = search(brute)
    code, solver, built = _solve(problem)
    assert code == cp_model.OPTIMAL
    assert solver.objective_value == best.value
    # the solver's order, run as soon as possible, reaches the optimum and fits the limit
    orders = _orders(solver, built, p, m)
    assert objective_of(problem, asap_times(problem, orders)) == best.value
    if limit is not None:
        assert max(peak_memory(problem, orders)) <= limit
    # and the search's best order, evaluated by the model's ASAP evaluator, agrees
    assert objective_of(problem, asap_times(problem, best.orders)) == best.value


def test_memory_encodings_agree():
    _, problem = _problems(3, 3, SKEWED, 1, 68, "span")
    values = []
    for memory in ("reservoir", "cumulative", "both"):
        code, solver, _ = _solve(problem, memory)
        assert code == cp_model.OPTIMAL
        values.append(solver.objective_value)
    assert (
        values[0]
        == values[1]
        == values[2]
        == search(_problems(3, 3, SKEWED, 1, 68, "span")[0]).value
    )


def test_limit_below_one_microbatch_is_infeasible():
    _, problem = _problems(2, 2, UNIFORM, 1, 33, "span")
    code, _, _ = _solve(problem)
    assert code == cp_model.INFEASIBLE


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    m=st.integers(1, 3),
    times=st.lists(st.integers(1, 9), min_size=6, max_size=6),
    t_comm=st.integers(0, 3),
    limit_mbs=st.sampled_from([None, 1, 2]),
    objective=st.sampled_from(["span", "makespan"]),
)
def test_random_two_stage_costs_match_exhaustive_search(m, times, t_comm, limit_mbs, objective):
    costs = {"t_f": tuple(times[0:2]), "t_b": tuple(times[2:4]), "t_w": tuple(times[4:6])}
    limit = None if limit_mbs is None else 34 * limit_mbs
    brute, problem = _problems(2, m, costs, t_comm, limit, objective)
    code, solver, _ = _solve(problem)
    assert code == cp_model.OPTIMAL
    assert solver.objective_value == search(brute).value


def test_relabel_in_order_keeps_asap_objective_and_memory():
    # any valid order, relabelled so each op kind runs in microbatch order, is no worse
    # (the symmetry-breaking argument of ilp_model's docstring), checked on every valid
    # schedule of a small case with per-stage costs
    brute, problem = _problems(2, 2, SKEWED, 1, None, "span")
    every = all_orders(brute)
    assert len(every) > 100
    for orders in every:
        relabelled = relabel_in_order(orders)
        before = objective_of(problem, asap_times(problem, orders))
        after = objective_of(problem, asap_times(problem, relabelled))
        assert after <= before
        assert peak_memory(problem, relabelled) == peak_memory(problem, orders)


def test_span_is_anchored_at_the_earliest_first_forward():
    # Measured from a stage's actual first op, the span rewards starting a stage late on
    # purpose: here stage 1 runs F1 before F0 and idles until F1 arrives (found by random
    # testing). The model measures from head[s] instead, where every in-order schedule starts.
    costs = {"t_f": (5, 2), "t_b": (1, 2), "t_w": (3, 8)}
    brute, problem = _problems(2, 2, costs, 1, None, "span")
    raw = search(Problem(**{**brute.__dict__, "objective": "raw_span"}))
    anchored = search(brute)
    assert (raw.value, anchored.value) == (24, 25)
    assert raw.orders[1][0] == ("F", 1)
    code, solver, _ = _solve(problem)
    assert code == cp_model.OPTIMAL and solver.objective_value == anchored.value


@pytest.mark.parametrize("solver", ["HIGHS", "SCIP"])
def test_big_m_milp_reaches_the_same_optimum(solver):
    from nobubble.pipeline.ilp.milp import solve_milp

    for case in (LIMITED, CASES[8]):  # p=2 m=3 with limit; p=3 m=3 skewed with limit
        brute, problem = _problems(*case)
        result = solve_milp(problem, solver=solver, time_limit_s=20)
        assert result.status == "optimal"
        assert round(result.objective) == search(brute).value
        assert objective_of(problem, asap_times(problem, result.orders)) == round(result.objective)


def test_memory_implied_precedences_cut_no_optimal_schedule():
    # the implied precedences only restate the limit: with and without them the optimum is
    # the same, and every valid schedule of the exhaustive search satisfies them
    from nobubble.pipeline.ilp.model import _implied_by_memory

    brute, problem = _problems(2, 3, SKEWED, 1, 68, "span")
    implied = [_implied_by_memory(problem, s) for s in range(2)]
    assert any(implied)
    for orders in all_orders(brute):
        for s, order in enumerate(relabel_in_order(orders)):
            pos = {op: k for k, op in enumerate(order)}
            for op, j, i in implied[s]:
                assert pos[op, j] < pos["F", i]
    values = []
    for flag in (True, False):
        built = build_cpsat(problem, implied=flag)
        solver = cp_model.CpSolver()
        solver.parameters.num_workers = 2
        assert solver.solve(built.model) == cp_model.OPTIMAL
        values.append(solver.objective_value)
    assert values[0] == values[1] == search(brute).value
