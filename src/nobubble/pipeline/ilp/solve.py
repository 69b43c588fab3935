"""Exact optimal zero-bubble schedules: a CP-SAT model warm-started by the heuristics.

:func:`solve_optimal` turns a :class:`~nobubble.pipeline.costs.CostModel` (one stage per
rank) into the integer problem of :mod:`nobubble.pipeline.ilp.model` (times scaled by the
smallest ``10**k``, k <= 6, that makes them integers, else rounded to ``1e-6``; memory
rounded so that an accepted schedule fits the real limit), hints it with the best heuristic
that fits, solves it and returns an ordinary :class:`~nobubble.pipeline.actions.Schedule`.
``objective`` is the simulator's span (or makespan) of that schedule (equal to the solver's
when the costs are exact in integer units); ``lower_bound`` is CP-SAT's proven bound,
``gap = (objective - lower_bound) / objective``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from nobubble.pipeline.actions import Action, Op, Schedule
from nobubble.pipeline.costs import CostModel
from nobubble.pipeline.ilp import model as ilp_model
from nobubble.pipeline.ilp.common import (
    DEFAULT_WORKERS,
    SolveResult,
    scaled_costs,
    solve_model,
)
from nobubble.pipeline.ilp.model import IntProblem, build_cpsat
from nobubble.pipeline.ilp.solve_chunks import rank_orders
from nobubble.validation import check_value, finite

__all__ = [
    "SolveResult",
    "solve_optimal",
    "HEURISTIC_NAMES",
    "DEFAULT_WORKERS",
    "to_int_problem",
    "stage_orders",
]

HEURISTIC_NAMES = ("zb-1p", "zb-2p", "zb-h1", "zb-h2", "1f1b")
"""Heuristic schedules tried as the warm start (the best that fits the memory limit wins)."""


# -- integer scaling -----------------------------------------------------------------------
def to_int_problem(
    costs: CostModel,
    *,
    num_microbatches: int,
    mem_limit: float | None,
    objective: str,
) -> tuple[IntProblem, float, float]:
    """Scale ``costs`` to integers; return ``(problem, time_unit, mem_unit)``.

    ``time_unit`` / ``mem_unit`` are the cost-unit sizes of one integer tick.
    """
    fields, k = scaled_costs(costs, mem_limit)
    problem = IntProblem(
        num_stages=costs.num_stages, num_microbatches=num_microbatches, objective=objective,
        **fields,
    )  # fmt: skip
    return problem, 1.0 / k.tscale, 1.0 / k.mscale


# -- Schedule <-> stage orders ----------------------------------------------------------------
def stage_orders(schedule: Schedule) -> list[list[tuple[str, int]]]:
    """Per-stage ``(op, microbatch)`` orders of a one-stage-per-rank schedule.

    A fused backward BW becomes B followed at once by W (same time, same memory).
    """
    if schedule.num_chunks != 1 or schedule.stage_to_rank != tuple(range(schedule.num_ranks)):
        raise ValueError(
            f"schedule {schedule.name!r} has {schedule.num_chunks} stages per rank; the exact "
            "solver handles one stage per rank (stage s on rank s) unless given num_chunks=2 "
            "and a placement"
        )
    return [[(op, mb) for op, _stage, mb in row] for row in rank_orders(schedule)]


def _to_schedule(
    orders: Sequence[Sequence[tuple[str, int]]], num_microbatches: int, name: str
) -> Schedule:
    rows = [tuple(Action(s, Op(op), mb) for op, mb in order) for s, order in enumerate(orders)]
    return Schedule(name, num_microbatches, tuple(range(len(orders))), tuple(rows))


# -- warm start ---------------------------------------------------------------------------
def _candidate_schedules(
    costs: CostModel, num_stages: int, num_microbatches: int, mem_limit: float | None
) -> list[Schedule]:
    from nobubble.pipeline.schedules import get_schedule

    out = []
    for name in HEURISTIC_NAMES:
        limit = mem_limit if name in ("zb-1p", "zb-2p") else None
        try:
            out.append(
                get_schedule(
                    name,
                    num_stages=num_stages,
                    num_microbatches=num_microbatches,
                    costs=costs,
                    mem_limit=limit,
                )  # fmt: skip
            )
        except (ImportError, ValueError):
            continue  # a heuristic that cannot make this shape is simply not a candidate
    return out


# -- the solve ----------------------------------------------------------------------------
def _check_args(
    costs, num_stages, num_microbatches, mem_limit, objective, time_limit_s, num_workers, warm_start
) -> None:
    check_value("num_stages", num_stages, ">= 1", integer=True)
    check_value("num_microbatches", num_microbatches, ">= 1", integer=True)
    if costs.num_stages != num_stages:
        raise ValueError(
            f"costs have {costs.num_stages} stages but num_stages={num_stages}; the exact solver "
            "needs one cost entry per rank (split over its chunks when num_chunks > 1)"
        )
    if objective not in ("span", "makespan"):
        raise ValueError(f"objective={objective!r}; use 'span' (the paper's cost) or 'makespan'")
    if not (time_limit_s > 0 and finite(time_limit_s)):
        raise ValueError(f"time_limit_s={time_limit_s} must be a positive number of seconds")
    if mem_limit is not None and not (mem_limit >= 0 and finite(mem_limit)):
        raise ValueError(f"mem_limit={mem_limit} must be a finite number >= 0 (or None)")
    if num_workers is not None:
        check_value("num_workers", num_workers, ">= 1", integer=True)
    if warm_start is not None and (
        warm_start.num_ranks != num_stages or warm_start.num_microbatches != num_microbatches
    ):
        raise ValueError(
            f"warm_start {warm_start.name!r} has {warm_start.num_ranks} ranks and "
            f"{warm_start.num_microbatches} microbatches; the problem has {num_stages} and "
            f"{num_microbatches}"
        )


def _check_chunks(num_chunks: int, placement: str | None) -> None:
    if not (isinstance(num_chunks, int) and num_chunks >= 1):
        raise ValueError(f"num_chunks={num_chunks!r} must be a positive integer (1, or 2 for V)")
    if num_chunks == 1 and placement not in (None, ""):
        raise ValueError(f"placement={placement!r} needs num_chunks >= 2; give num_chunks=2")
    if num_chunks > 1 and placement not in (None, "v", "interleaved"):
        raise ValueError(f"placement={placement!r}; use 'v' or 'interleaved'")


def solve_optimal(
    costs: CostModel,
    *,
    num_stages: int,
    num_microbatches: int,
    mem_limit: float | None = None,
    objective: str = "span",
    time_limit_s: float = 60.0,
    warm_start: Schedule | None = None,
    use_heuristics: bool = True,
    num_workers: int | None = None,
    memory_encoding: str = "reservoir",
    on_solution: Callable[[float, float, float], None] | None = None,
    num_chunks: int = 1,
    placement: str | None = None,
) -> SolveResult:
    """Find the schedule of least span (or makespan) for p stages and m microbatches.

    Args:
        costs: per-stage costs, ``costs.num_stages == num_stages`` (one stage per rank).
        num_stages: p. num_microbatches: m.
        mem_limit: per-rank activation-memory limit in ``mem_f`` units (None: no limit);
            ZB-1p's is ``p * M_F``.
        objective: ``"span"`` (longest per-rank span, the paper's cost) or ``"makespan"``.
        time_limit_s: CP-SAT wall-clock limit.
        warm_start: a schedule to hint (in addition to the heuristics).
        use_heuristics: also try :data:`HEURISTIC_NAMES` as hints.
        num_workers: CP-SAT search workers (default :data:`DEFAULT_WORKERS` = 8 even on
            fewer cores: the portfolio's LNS workers matter more than the core count).
        memory_encoding: ``"reservoir"``, ``"cumulative"`` or ``"both"`` (see
            :func:`~nobubble.pipeline.ilp.model.build_cpsat`).
        on_solution: called with ``(objective, bound, seconds)`` at each improving solution.
        num_chunks: stages per rank; above 1 the costs (per rank) are split evenly over the
            rank's chunks as the simulator splits them, and the model is
            :mod:`nobubble.pipeline.ilp.chunks` (``memory_encoding`` is then the reservoir).
        placement: with ``num_chunks > 1``: ``"v"`` (ZB-V's shape, the default) or
            ``"interleaved"`` (stage s on rank s % p); warm starts are that placement's
            schedules (:data:`~nobubble.pipeline.ilp.solve_chunks.CHUNK_HEURISTICS`).
    """
    _check_args(
        costs, num_stages, num_microbatches, mem_limit, objective, time_limit_s, num_workers,
        warm_start,
    )  # fmt: skip
    _check_chunks(num_chunks, placement)
    if num_chunks > 1:
        from nobubble.pipeline.ilp.solve_chunks import solve_chunked

        return solve_chunked(
            costs, num_chunks=num_chunks, placement=placement or "v",
            num_microbatches=num_microbatches, mem_limit=mem_limit, objective=objective,
            time_limit_s=time_limit_s, warm_start=warm_start, use_heuristics=use_heuristics,
            num_workers=num_workers, on_solution=on_solution,
        )  # fmt: skip
    problem, time_unit, _ = to_int_problem(
        costs, num_microbatches=num_microbatches, mem_limit=mem_limit, objective=objective
    )
    candidates = [] if warm_start is None else [warm_start]
    if use_heuristics:
        candidates += _candidate_schedules(costs, num_stages, num_microbatches, mem_limit)
    named = [(s.name, stage_orders(s)) for s in candidates]
    built = build_cpsat(problem, memory=memory_encoding)
    p, m = problem.num_stages, problem.num_microbatches

    def orders_of(solver) -> list:
        orders = []
        for s in range(p):
            ops = sorted((solver.value(built.start[op, s, i]), op, i) for op in "FBW"
                         for i in range(m))  # fmt: skip
            orders.append([(op, i) for _, op, i in ops])
        return orders

    return solve_model(
        problem, costs, named, ilp_model, built, orders_of=orders_of,
        to_schedule=lambda orders, name: _to_schedule(orders, m, name),
        name=f"ilp-{objective}", time_limit_s=time_limit_s, num_workers=num_workers,
        on_solution=on_solution, time_unit=time_unit, mem_limit=mem_limit,
    )  # fmt: skip
