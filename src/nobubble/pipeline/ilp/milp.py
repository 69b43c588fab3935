"""The same problem as the paper's big-M MILP, for comparison with CP-SAT.

Built over :class:`~nobubble.pipeline.ilp.model.IntProblem` through
``ortools.linear_solver`` (HiGHS, SCIP or CBC), with the CP-SAT model's in-order symmetry
breaking and anchored span, so the two optima must agree (``benchmarks/ilp_scaling.py``);
the library solves with CP-SAT. Per stage, start times are continuous; a binary per
unordered pair of ops of different kinds with two big-M rows keeps them apart; memory is
checked at each F: ``(i+1) mem_f + sum_j mem_b [B_j before F_i] + sum_j mem_w [W_j before
F_i] <= limit``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from ortools.linear_solver import pywraplp

from nobubble.pipeline.ilp.model import IntProblem, head_starts

__all__ = ["MilpResult", "solve_milp"]


@dataclass(frozen=True)
class MilpResult:
    """``status`` in optimal / feasible / infeasible / unknown; times in integer ticks."""

    status: str
    objective: float | None
    lower_bound: float | None
    seconds: float
    orders: list[list[tuple[str, int]]] | None
    num_binaries: int


def _forced(a: tuple[str, int], b: tuple[str, int]) -> bool:
    """True when op ``a`` is before op ``b`` on a stage by dependency or symmetry breaking."""
    (oa, ia), (ob, ib) = a, b
    rank = {"F": 0, "B": 1, "W": 2}
    return rank[oa] < rank[ob] and ia <= ib


def solve_milp(
    problem: IntProblem, *, solver: str = "HIGHS", time_limit_s: float = 60.0
) -> MilpResult:
    """Solve ``problem`` as a big-M MILP with ``solver`` (HIGHS, SCIP or CBC)."""
    lp = pywraplp.Solver.CreateSolver(solver)
    if lp is None:
        raise ValueError(f"MILP solver {solver!r} is not available; use HIGHS, SCIP or CBC")
    p, m = problem.num_stages, problem.num_microbatches
    big_m = float(problem.horizon())
    heads = head_starts(problem)
    start = {
        (op, s, i): lp.NumVar(0.0, big_m, f"{op}{s}_{i}")
        for s in range(p)
        for op in "FBW"
        for i in range(m)
    }

    def end(op, s, i):
        return start[op, s, i] + problem.duration(op, s)

    for s in range(p):
        lp.Add(start["F", s, 0] == heads[s])
        for i in range(m):
            if s > 0:
                lp.Add(start["F", s, i] >= end("F", s - 1, i) + problem.t_comm)
            if s == p - 1:
                lp.Add(start["B", s, i] >= end("F", s, i))
            else:
                lp.Add(start["B", s, i] >= end("B", s + 1, i) + problem.t_comm)
            lp.Add(start["W", s, i] >= end("B", s, i))
            if i > 0:
                for op in "FBW":
                    lp.Add(start[op, s, i] >= end(op, s, i - 1))
    before: dict[tuple, pywraplp.Variable] = {}  # (s, a, b) -> 1 if a runs before b
    for s in range(p):
        ops = [(op, i) for op in "FBW" for i in range(m)]
        for x, a in enumerate(ops):
            for b in ops[x + 1 :]:
                if a[0] == b[0] or _forced(a, b) or _forced(b, a):
                    continue
                y = lp.BoolVar(f"y{s}_{a[0]}{a[1]}_{b[0]}{b[1]}")
                before[s, a, b], before[s, b, a] = y, 1 - y
                lp.Add(end(a[0], s, a[1]) <= start[b[0], s, b[1]] + big_m * (1 - y))
                lp.Add(end(b[0], s, b[1]) <= start[a[0], s, a[1]] + big_m * y)
        if problem.mem_limit is not None:
            for i in range(m):
                level = (i + 1) * problem.mem_f[s]
                for j in range(i):  # B_j / W_j with j >= i cannot precede F_i
                    level += problem.mem_b[s] * before[s, ("B", j), ("F", i)]
                    level += problem.mem_w[s] * before[s, ("W", j), ("F", i)]
                lp.Add(level <= problem.mem_limit)
    objective = lp.NumVar(0.0, big_m, "objective")
    for s in range(p):
        offset = heads[s] if problem.objective == "span" else 0
        lp.Add(objective >= end("W", s, m - 1) - offset)
    lp.Minimize(objective)
    lp.SetTimeLimit(int(time_limit_s * 1000))
    t0 = time.perf_counter()
    code = lp.Solve()
    seconds = time.perf_counter() - t0
    return _result(lp, code, start, objective, p, m, seconds, len(before) // 2)


def _result(lp, code, start, objective, p, m, seconds, num_binaries) -> MilpResult:
    if code == pywraplp.Solver.INFEASIBLE:
        return MilpResult("infeasible", None, None, seconds, None, num_binaries)
    if code not in (pywraplp.Solver.OPTIMAL, pywraplp.Solver.FEASIBLE):
        return MilpResult("unknown", None, None, seconds, None, num_binaries)
    orders = []
    for s in range(p):
        ops = sorted((start[op, s, i].solution_value(), op, i) for op in "FBW" for i in range(m))
        orders.append([(op, i) for _, op, i in ops])
    status = "optimal" if code == pywraplp.Solver.OPTIMAL else "feasible"
    bound = lp.Objective().BestBound() if status == "feasible" else objective.solution_value()
    return MilpResult(status, objective.solution_value(), bound, seconds, orders, num_binaries)
