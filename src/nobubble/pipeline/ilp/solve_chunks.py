"""The exact solver for several chunks per rank (V and interleaved placements), what
:func:`~nobubble.pipeline.ilp.solve.solve_optimal` runs for ``num_chunks > 1``: per-rank
costs split over the chunks as the simulator splits them, scaled to integers, modelled by
:mod:`nobubble.pipeline.ilp.chunks` and warm-started by the best schedule of the same
placement that fits the memory limit (:data:`CHUNK_HEURISTICS` and the memory-capped list
scheduler of :mod:`nobubble.pipeline.ilp.greedy`), so the answer is never worse than theirs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from nobubble.pipeline.actions import Action, Op, Schedule
from nobubble.pipeline.costs import CostModel
from nobubble.pipeline.ilp import chunks
from nobubble.pipeline.ilp.chunks import ChunkProblem, placement_map
from nobubble.pipeline.ilp.common import (
    SolveResult,
    scaled_costs,
    solve_model,
)
from nobubble.pipeline.ilp.greedy import greedy_orders

__all__ = ["CHUNK_HEURISTICS", "solve_chunked", "to_chunk_problem", "rank_orders"]

CHUNK_HEURISTICS = {"v": ("zb-v", "v-min", "v-half", "v-zb"), "interleaved": ("interleaved-1f1b",)}
"""Published schedules tried as warm starts per placement (two chunks only)."""

_Orders = list[list[tuple[str, int, int]]]


def to_chunk_problem(
    costs: CostModel,
    *,
    stage_to_rank: Sequence[int],
    num_microbatches: int,
    mem_limit: float | None,
    objective: str,
) -> tuple[ChunkProblem, float]:
    """Split per-rank ``costs`` over ``stage_to_rank`` and scale to integers; return
    ``(problem, time_unit)``. Memory rounds F's store up and the frees and limit down."""
    stage = costs.for_stages(stage_to_rank)
    fields, k = scaled_costs(stage, mem_limit)
    problem = ChunkProblem(
        num_ranks=costs.num_stages, num_microbatches=num_microbatches,
        stage_to_rank=tuple(stage_to_rank), objective=objective, **fields,
    )  # fmt: skip
    return problem, 1.0 / k.tscale


def rank_orders(schedule: Schedule) -> _Orders:
    """Per-rank ``(op, stage, mb)`` orders; a fused BW becomes B then W (same time, memory)."""
    out = []
    for actions in schedule.rank_actions:
        row: list[tuple[str, int, int]] = []
        for a in actions:
            if a.op is Op.BW:
                row += [("B", a.stage, a.microbatch), ("W", a.stage, a.microbatch)]
            else:
                row.append((a.op.value, a.stage, a.microbatch))
        out.append(row)
    return out


def _to_schedule(problem: ChunkProblem, orders: _Orders, name: str) -> Schedule:
    rows = [tuple(Action(s, Op(op), i) for op, s, i in order) for order in orders]
    return Schedule(name, problem.num_microbatches, problem.stage_to_rank, tuple(rows))


def _candidates(costs, problem, placement, warm_start) -> list[tuple[str, _Orders]]:
    from nobubble.pipeline.schedules import get_schedule

    p, m = problem.num_ranks, problem.num_microbatches
    out = [] if warm_start is None else [(warm_start.name, rank_orders(warm_start))]
    names = CHUNK_HEURISTICS[placement] if problem.num_stages == 2 * p else ()
    if placement == "interleaved" and problem.num_stages > 2 * p:
        names = ("interleaved-1f1b",)
    for name in names:
        chunks_kw = {"num_chunks": problem.num_stages // p} if placement == "interleaved" else {}
        try:
            sched = get_schedule(name, num_ranks=p, num_microbatches=m, costs=costs, **chunks_kw)
        except ValueError:
            continue  # a shape the generator refuses (interleaved needs m % p == 0)
        out.append((name, rank_orders(sched)))
    for priority in ("bfw", "bwf"):
        orders = greedy_orders(problem, priority=priority)
        if orders is not None:
            out.append((f"greedy-{priority}", orders))
    return out


def solve_chunked(
    costs: CostModel,
    *,
    num_chunks: int,
    placement: str,
    num_microbatches: int,
    mem_limit: float | None,
    objective: str,
    time_limit_s: float,
    warm_start: Schedule | None,
    use_heuristics: bool,
    num_workers: int | None,
    on_solution: Callable[[float, float, float], None] | None,
) -> SolveResult:
    """The exact solve for ``num_chunks`` stages per rank (arguments as
    :func:`~nobubble.pipeline.ilp.solve.solve_optimal`, already checked there)."""
    owner = placement_map(placement, costs.num_stages, num_chunks)
    if warm_start is not None and warm_start.stage_to_rank != owner:
        raise ValueError(
            f"warm_start {warm_start.name!r} places stages on ranks {warm_start.stage_to_rank}; "
            f"placement={placement!r} with {num_chunks} chunks is {owner}; give a schedule of "
            "that placement"
        )
    problem, time_unit = to_chunk_problem(
        costs, stage_to_rank=owner, num_microbatches=num_microbatches, mem_limit=mem_limit,
        objective=objective,
    )  # fmt: skip
    found = _candidates(costs, problem, placement, warm_start) if use_heuristics else (
        [] if warm_start is None else [(warm_start.name, rank_orders(warm_start))]
    )  # fmt: skip
    built = chunks.build_cpsat(problem)

    def orders_of(solver) -> _Orders:
        orders: _Orders = []
        for r in range(problem.num_ranks):
            ops = sorted((solver.value(built.start[op, s, i]), op, s, i)
                         for s in problem.stages_of(r) for op in "FBW"
                         for i in range(problem.num_microbatches))  # fmt: skip
            orders.append([(op, s, i) for _, op, s, i in ops])
        return orders

    return solve_model(
        problem, costs, found, chunks, built, orders_of=orders_of,
        to_schedule=lambda orders, name: _to_schedule(problem, orders, name),
        name=f"ilp-{placement}-{objective}", time_limit_s=time_limit_s,
        num_workers=num_workers, on_solution=on_solution, time_unit=time_unit,
        mem_limit=mem_limit, where=f" ({placement}, {num_chunks} chunks)",
        extra={"num_chunks": num_chunks, "placement": placement},
    )  # fmt: skip
