"""What both exact solvers share: the result type, integer scaling, progress, hints.

:mod:`nobubble.pipeline.ilp.solve` (one stage per rank) and
:mod:`nobubble.pipeline.ilp.solve_chunks` (several) both return :class:`SolveResult`.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields

from ortools.sat.python import cp_model

from nobubble.pipeline.actions import Schedule
from nobubble.pipeline.costs import CostModel
from nobubble.pipeline.simulate import SimResult, simulate

__all__ = ["SolveResult", "DEFAULT_WORKERS"]

_MAX_DIGITS = 6
DEFAULT_WORKERS = 8


@dataclass(frozen=True, kw_only=True)
class SolveResult:
    """Outcome of :func:`~nobubble.pipeline.ilp.solve.solve_optimal`.

    Attributes:
        schedule: the best schedule found (None when infeasible / unknown).
        status: ``"optimal"`` (proven), ``"feasible"`` (time limit hit with a schedule),
            ``"infeasible"`` (proven: no schedule fits the memory limit) or ``"unknown"``.
        objective: the simulator's span (or makespan) of ``schedule``, in cost units.
        lower_bound: the solver's proven lower bound, in cost units.
        gap: ``(objective - lower_bound) / objective`` (0 when optimal).
        solve_seconds: wall time of the CP-SAT solve.
        explanation: one plain sentence on the outcome (why infeasible, what was hinted).
        objective_kind: ``"span"`` or ``"makespan"``.
        bubble_rate: the simulator's bubble rate of ``schedule``.
        peak_memory: per-rank peak activation memory of ``schedule``.
        heuristic: name of the warm-start schedule ("" when none fitted).
        heuristic_objective: its simulated objective (None when none fitted).
        heuristic_bubble_rate: its simulated bubble rate (None when none fitted).
        time_unit: size of one solver tick in cost units (e.g. 1e-3).
        num_chunks: stages per rank (1, or 2 for V / interleaved).
        placement: ``""`` for one chunk, else ``"v"`` or ``"interleaved"``.
        mem_limit: the activation limit per rank it was solved under, in the unit of the
            costs' ``mem_f`` (None: none).
        simulation: the full :class:`SimResult` of ``schedule``.
    """

    schedule: Schedule | None
    status: str
    objective: float | None
    lower_bound: float | None
    gap: float | None
    solve_seconds: float
    explanation: str
    objective_kind: str = "span"
    bubble_rate: float | None = None
    peak_memory: tuple[float, ...] = ()
    heuristic: str = ""
    heuristic_objective: float | None = None
    heuristic_bubble_rate: float | None = None
    time_unit: float = 1.0
    num_chunks: int = 1
    placement: str = ""
    mem_limit: float | None = None
    simulation: SimResult | None = field(default=None, repr=False, compare=False)

    def summary(self) -> dict:
        """JSON-ready figures: every field but the schedule objects, and the schedule as
        torch's CSV (None without one)."""
        out = {f.name: getattr(self, f.name) for f in fields(self)
               if f.name not in ("schedule", "simulation")}  # fmt: skip
        out["peak_memory"] = list(self.peak_memory)
        out["schedule_csv"] = self.schedule.to_csv() if self.schedule is not None else None
        return out


@dataclass(frozen=True)
class IntScaling:
    """How one cost model's times and memory become the solver's integer ticks: times by
    the smallest power of ten that makes them exact; memory too, else ~9 significant digits
    rounded towards the safe side (a store up, a free and the limit down)."""

    tscale: int
    mscale: int

    @staticmethod
    def of(costs: CostModel, mem_limit: float | None) -> IntScaling:
        tscale, _ = _decimal_scale([*costs.t_f, *costs.t_b, *costs.t_w, costs.t_comm])
        mems = [
            *costs.mem_f,
            *costs.mem_b,
            *costs.mem_w,
            *([] if mem_limit is None else [mem_limit]),
        ]
        mscale, exact = _decimal_scale(mems)
        if not exact:
            mscale = 10 ** max(0, 9 - math.ceil(math.log10(max(abs(v) for v in mems) + 1)))
        return IntScaling(tscale, mscale)

    def times(self, values: Sequence[float]) -> tuple[int, ...]:
        return tuple(round(v * self.tscale) for v in values)

    def up(self, v: float) -> int:
        return math.ceil(v * self.mscale - 1e-9)

    def down(self, v: float) -> int:
        return math.floor(v * self.mscale + 1e-9)


def scaled_costs(costs: CostModel, mem_limit: float | None) -> tuple[dict, IntScaling]:
    """The problem fields of per-stage ``costs`` in integer ticks, and the scaling used: F's
    store rounded up, the frees (negative deltas) and the limit down."""
    k = IntScaling.of(costs, mem_limit)
    fields = {
        "t_f": k.times(costs.t_f), "t_b": k.times(costs.t_b), "t_w": k.times(costs.t_w),
        "t_comm": k.times([costs.t_comm])[0],
        "mem_f": tuple(k.up(v) for v in costs.mem_f),
        "mem_b": tuple(-k.down(v) for v in costs.mem_b),  # model deltas: B and W free memory
        "mem_w": tuple(-k.down(v) for v in costs.mem_w),
        "mem_limit": None if mem_limit is None else k.down(mem_limit),
    }  # fmt: skip
    return fields, k


def _decimal_scale(values: Sequence[float]) -> tuple[int, bool]:
    """Smallest ``10**k`` (k <= 6) making every value an integer; ``(scale, exact)``."""
    for k in range(_MAX_DIGITS + 1):
        scale = 10**k
        if all(
            abs(v * scale - round(v * scale)) <= 1e-9 * max(1.0, abs(v * scale)) for v in values
        ):
            return scale, True
    return 10**_MAX_DIGITS, False


def _sim_objective(sim: SimResult, objective: str) -> float:
    return sim.max_span if objective == "span" else sim.makespan


@dataclass(frozen=True)
class _Hint:
    name: str
    orders: list  # per stage [(op, mb)], or per rank [(op, stage, mb)] with several chunks
    times: dict  # the ASAP start tick of every op, the solver's hint
    int_objective: int
    sim: SimResult


def best_hint(
    problem,
    costs: CostModel,
    candidates: Sequence[tuple[str, list]],
    model,
    to_schedule: Callable[[list, str], Schedule],
) -> _Hint | None:
    """The candidate ``(name, orders)`` of least integer objective among those whose peak fits
    ``problem.mem_limit``, relabelled in order; ``model`` is the problem's module
    (:mod:`.model` or :mod:`.chunks`: ``relabel_in_order``, ``peak_memory``, ``asap_times``,
    ``objective_of``); the winner alone is simulated."""
    best: tuple[int, str, list, dict] | None = None
    limit = problem.mem_limit
    for name, raw in candidates:
        orders = model.relabel_in_order(raw)
        if limit is not None and max(model.peak_memory(problem, orders)) > limit:
            continue
        times = model.asap_times(problem, orders)
        value = model.objective_of(problem, times)
        if best is None or value < best[0]:
            best = (value, name, orders, times)
    if best is None:
        return None
    value, name, orders, times = best
    return _Hint(name, orders, times, value, simulate(to_schedule(orders, name), costs))


def _explain_infeasible(costs: CostModel, mem_limit: float | None) -> str:
    if mem_limit is None:
        return "the solver proved the problem infeasible (unexpected without a memory limit)"
    worst = max(range(costs.num_stages), key=lambda s: costs.mem_f[s])
    if mem_limit < costs.mem_f[worst]:
        return (
            f"memory limit {mem_limit:g} is below the activation memory of a single microbatch "
            f"on stage {worst} (M_F = {costs.mem_f[worst]:g}): no schedule can run even one "
            f"forward there; raise the limit to at least {costs.mem_f[worst]:g}"
        )
    return f"no order of F/B/W keeps every stage's activation memory within {mem_limit:g}"


class _Progress(cp_model.CpSolverSolutionCallback):
    def __init__(self, report: Callable[[float, float, float], None], unit: float) -> None:
        super().__init__()
        self._report, self._unit = report, unit

    def on_solution_callback(self) -> None:
        self._report(
            self.objective_value * self._unit,
            self.best_objective_bound * self._unit,
            self.wall_time,
        )


def run_cpsat(
    built,
    hint: _Hint | None,
    *,
    time_limit_s: float,
    num_workers: int | None,
    on_solution: Callable[[float, float, float], None] | None,
    time_unit: float,
) -> tuple[cp_model.CpSolver, cp_model.CpSolverStatus, float]:
    """Hint ``built`` (a model with ``model``, ``start`` and ``objective``) with the warm start
    (its ASAP start tick of every op) and solve it; return ``(solver, status code,
    seconds)``. Seeded, so a run repeats."""
    if hint is not None:
        for key, var in built.start.items():
            built.model.add_hint(var, hint.times[key])
        built.model.add_hint(built.objective, hint.int_objective)
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = float(time_limit_s)
    solver.parameters.num_workers = num_workers or DEFAULT_WORKERS
    solver.parameters.random_seed = 0
    callback = None if on_solution is None else _Progress(on_solution, time_unit)
    t0 = time.perf_counter()
    code = solver.solve(built.model, callback)
    return solver, code, time.perf_counter() - t0


def solve_model(
    problem, costs: CostModel, candidates: Sequence[tuple[str, list]], model, built, *,
    orders_of: Callable[[cp_model.CpSolver], list], to_schedule: Callable[[list, str], Schedule],
    name: str, time_limit_s: float, num_workers: int | None,
    on_solution: Callable[[float, float, float], None] | None, time_unit: float,
    mem_limit: float | None, where: str = "", extra: dict | None = None,
) -> SolveResult:  # fmt: skip
    """Warm-start ``built`` (``model``'s CP-SAT model of ``problem``) with the best of
    ``candidates`` (:func:`best_hint`), solve it (:func:`run_cpsat`) and return the result
    (:func:`cpsat_result`) named ``name``; ``orders_of`` reads the solver's orders, ``extra``
    adds fields to every result."""
    hint = best_hint(problem, costs, candidates, model, to_schedule)
    solver, code, seconds = run_cpsat(
        built, hint, time_limit_s=time_limit_s, num_workers=num_workers,
        on_solution=on_solution, time_unit=time_unit,
    )  # fmt: skip
    common = {"objective_kind": problem.objective, "solve_seconds": seconds,
              "time_unit": time_unit, "mem_limit": mem_limit, **(extra or {}),
              **hint_fields(hint, problem.objective)}  # fmt: skip
    return cpsat_result(
        problem, costs, solver, code, hint, orders_of=orders_of,
        value_of=lambda orders: model.objective_of(problem, model.asap_times(problem, orders)),
        to_schedule=lambda orders: to_schedule(orders, name), seconds=seconds,
        time_unit=time_unit, mem_limit=mem_limit, where=where, common=common,
    )  # fmt: skip


def cpsat_result(
    problem, costs: CostModel, solver: cp_model.CpSolver, code: cp_model.CpSolverStatus,
    hint: _Hint | None, *,
    orders_of: Callable[[cp_model.CpSolver], list], value_of: Callable[[list], int],
    to_schedule: Callable[[list], Schedule], seconds: float, time_unit: float,
    mem_limit: float | None, where: str, common: dict,
) -> SolveResult:  # fmt: skip
    """The result of a CP-SAT solve of ``problem``: the solver's schedule (``orders_of`` reads
    its orders, ``value_of`` their integer objective, ``to_schedule`` makes the schedule), or
    the warm start's when it is better (only before optimality), or, when CP-SAT found no
    schedule of its own in time, the warm start (it fits the limits, so it is the answer,
    feasible) against the bound proved so far (0 if none); else infeasible / unknown."""
    objective = problem.objective
    if code == cp_model.UNKNOWN and hint is not None:
        bound = solver.best_objective_bound
        bound = min(bound, hint.int_objective) if math.isfinite(bound) and bound > 0 else 0.0
        return solved_result(
            to_schedule(hint.orders), costs, proven=False, bound_ticks=bound,
            time_unit=time_unit, objective=objective, hint=hint, from_hint=True,
            seconds=seconds, where=where, common=common,
        )  # fmt: skip
    early = unsolved_result(code, costs, mem_limit, common)
    if early is not None:
        return early
    orders = orders_of(solver)
    value = value_of(orders)
    from_hint = False
    if hint is not None and hint.int_objective < value:  # only before optimality
        orders, value, from_hint = hint.orders, hint.int_objective, True
    return solved_result(
        to_schedule(orders), costs,
        proven=code == cp_model.OPTIMAL and value <= solver.objective_value,
        bound_ticks=min(solver.best_objective_bound, value), time_unit=time_unit,
        objective=objective, hint=hint, from_hint=from_hint, seconds=seconds, where=where,
        common=common,
    )  # fmt: skip


def unsolved_result(code: cp_model.CpSolverStatus, costs: CostModel, mem_limit: float | None,
                    common: dict) -> SolveResult | None:  # fmt: skip
    """The result when CP-SAT ended without a schedule (infeasible, or none in time); None
    when it has one. ``common``: the fields every result of this solve shares."""
    if code == cp_model.INFEASIBLE:
        return SolveResult(schedule=None, status="infeasible", objective=None, lower_bound=None,
                           gap=None, explanation=_explain_infeasible(costs, mem_limit),
                           **common)  # fmt: skip
    if code not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return SolveResult(schedule=None, status="unknown", objective=None, lower_bound=None,
                           gap=None, explanation="no schedule found within the time limit; "
                           "raise time_limit_s", **common)  # fmt: skip
    return None


def solved_result(
    schedule: Schedule, costs: CostModel, *, proven: bool, bound_ticks: float, time_unit: float,
    objective: str, hint: _Hint | None, from_hint: bool, seconds: float, where: str, common: dict,
) -> SolveResult:  # fmt: skip
    """The result for ``schedule`` (the solver's, or the warm start's when ``from_hint``):
    simulated, with CP-SAT's bound (``bound_ticks`` in integer ticks of ``time_unit``), the
    gap, and a note on how it was reached."""
    status = "optimal" if proven else "feasible"
    sim = simulate(schedule, costs)
    bound = bound_ticks * time_unit
    obj = _sim_objective(sim, objective)
    gap = 0.0 if proven else max(0.0, (obj - bound) / obj)
    note = f"{status} after {seconds:.1f} s{where}"
    if hint is not None:
        note += f"; warm start {hint.name} ({_sim_objective(hint.sim, objective):.6g})"
    if from_hint:
        note += "; the solver found nothing better than the warm start"
    return SolveResult(schedule=schedule, status=status, objective=obj, lower_bound=bound,
                       gap=gap, explanation=note, bubble_rate=sim.bubble_rate,
                       peak_memory=sim.peak_memory, simulation=sim, **common)  # fmt: skip


def hint_fields(hint: _Hint | None, objective: str) -> dict:
    """The warm start's name, objective and bubble rate for a SolveResult (empty: none)."""
    if hint is None:
        return {}
    return {"heuristic": hint.name, "heuristic_objective": _sim_objective(hint.sim, objective),
            "heuristic_bubble_rate": hint.sim.bubble_rate}  # fmt: skip
