"""The exact scheduling problem with several stages (chunks) per rank, and its CP-SAT model.

The model is cut into ``S = p * v`` stages placed by :func:`placement_map`: ``"v"`` (chunk c
runs down the ranks when c is even, up when odd: rank r holds stages r and 2p-1-r for v = 2)
or ``"interleaved"`` (stage s on rank ``s % p``). Semantics are the simulator's: ``t_comm``
only between ranks, one op at a time per *rank*, one memory reservoir per rank summed over
its chunks. Objective ``span`` (from ``head[r]``, the earliest start of rank r's first
forward, where ``F[r,0]`` is fixed) or ``makespan``. F, B and W of each stage run in
microbatch order (exact for any placement; the argument is in docs/pipeline/ilp.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ortools.sat.python import cp_model

from nobubble.pipeline.ilp.model import PerStageCosts

__all__ = [
    "PLACEMENTS",
    "ChunkProblem",
    "RankOrder",
    "ChunkCpSat",
    "placement_map",
    "head_starts",
    "asap_times",
    "objective_of",
    "peak_memory",
    "relabel_in_order",
    "build_cpsat",
]

PLACEMENTS = ("v", "interleaved")

RankOrder = Sequence[tuple[str, int, int]]
"""One rank's ops in execution order: ``[("F", stage, microbatch), ...]``."""

_OPS = ("F", "B", "W")


def placement_map(placement: str, num_ranks: int, num_chunks: int) -> tuple[int, ...]:
    """``stage_to_rank`` for ``placement`` (module docstring), ``num_ranks * num_chunks``
    entries; v = 2 gives ``v_stage_to_rank`` / the interleaved map of the generators."""
    p, v = num_ranks, num_chunks
    if placement not in PLACEMENTS:
        raise ValueError(f"placement={placement!r}; use 'v' or 'interleaved'")
    if placement == "interleaved":
        return tuple(s % p for s in range(p * v))
    return tuple(s % p if (s // p) % 2 == 0 else p - 1 - s % p for s in range(p * v))


@dataclass(frozen=True, kw_only=True)
class ChunkProblem(PerStageCosts):
    """The problem in integer units, per *stage* (``S = len(stage_to_rank)`` entries of
    every per-stage field, :class:`~nobubble.pipeline.ilp.model.PerStageCosts`): ``num_ranks``
    p, ``stage_to_rank`` the rank of each stage (stage r must be on rank r for r < p);
    ``t_comm`` is paid between ranks only, ``mem_limit`` holds per rank."""

    num_ranks: int
    stage_to_rank: tuple[int, ...]

    def __post_init__(self) -> None:
        p, m, owner = self.num_ranks, self.num_microbatches, tuple(self.stage_to_rank)
        if p < 1 or m < 1:
            raise ValueError(f"num_ranks={p}, num_microbatches={m}: both must be >= 1")
        if len(owner) < p or owner[:p] != tuple(range(p)) or not set(owner) <= set(range(p)):
            raise ValueError(
                f"stage_to_rank={owner}: stages 0..{p - 1} must sit on ranks 0..{p - 1} and "
                "every stage on a rank < p (use placement_map)"
            )
        object.__setattr__(self, "stage_to_rank", owner)
        self._check_per_stage(len(owner))

    @property
    def num_stages(self) -> int:
        return len(self.stage_to_rank)

    def stages_of(self, rank: int) -> tuple[int, ...]:
        return tuple(s for s, r in enumerate(self.stage_to_rank) if r == rank)

    def delay(self, src: int, dst: int) -> int:
        """Transfer time from stage ``src`` to ``dst``: t_comm across ranks, 0 inside one."""
        return 0 if self.stage_to_rank[src] == self.stage_to_rank[dst] else self.t_comm


def dependencies(problem: ChunkProblem, op: str, s: int, i: int) -> list[tuple[str, int, int]]:
    """``[(op, stage, delay)]`` that ``op`` of stage s on microbatch i waits for."""
    if op == "F":
        return [] if s == 0 else [("F", s - 1, problem.delay(s - 1, s))]
    if op == "W":
        return [("B", s, 0)]
    if s == problem.num_stages - 1:
        return [("F", s, 0)]
    return [("B", s + 1, problem.delay(s + 1, s)), ("F", s, 0)]


def _earliest(problem: ChunkProblem) -> dict[tuple[str, int], int]:
    """Earliest start of each (op, stage) for one microbatch alone (critical path)."""
    out: dict[tuple[str, int], int] = {}
    order = [("F", s) for s in range(problem.num_stages)]
    order += [(op, s) for s in reversed(range(problem.num_stages)) for op in ("B", "W")]
    for op, s in order:
        out[op, s] = max(
            (out[d, ds] + problem.duration(d, ds) + delay
             for d, ds, delay in dependencies(problem, op, s, 0)),
            default=0,
        )  # fmt: skip
    return out


def head_starts(problem: ChunkProblem) -> tuple[int, ...]:
    """Earliest start of each rank's first op, ``F`` of stage r (module docstring)."""
    earliest = _earliest(problem)
    return tuple(earliest["F", r] for r in range(problem.num_ranks))


def asap_times(problem: ChunkProblem, orders: Sequence[RankOrder]) -> dict[tuple, int]:
    """Run per-rank ``orders`` as soon as possible: start tick of every ``(op, stage, mb)``.

    Raises ValueError on a deadlock or on an order that does not hold each op once.
    """
    p, m = problem.num_ranks, problem.num_microbatches
    if len(orders) != p:
        raise ValueError(f"{len(orders)} rank orders for {p} ranks")
    for r, order in enumerate(orders):
        want = sorted((op, s, i) for s in problem.stages_of(r) for op in _OPS for i in range(m))
        if sorted(order) != want:
            raise ValueError(f"rank {r} order does not hold F, B, W of its stages once each")
    start: dict[tuple, int] = {}
    pos, free, progressed = [0] * p, [0] * p, True
    while progressed:
        progressed = False
        for r in range(p):
            while pos[r] < len(orders[r]):
                op, s, i = orders[r][pos[r]]
                ready = free[r]
                deps = dependencies(problem, op, s, i)
                if any((d, ds, i) not in start for d, ds, _ in deps):
                    break
                for d, ds, delay in deps:
                    ready = max(ready, start[d, ds, i] + problem.duration(d, ds) + delay)
                start[op, s, i] = ready
                free[r] = ready + problem.duration(op, s)
                pos[r] += 1
                progressed = True
    stuck = [f"rank {r} at {orders[r][pos[r]]}" for r in range(p) if pos[r] < len(orders[r])]
    if stuck:
        raise ValueError(f"rank orders deadlock: {', '.join(stuck)}")
    return start


def objective_of(problem: ChunkProblem, start: dict[tuple, int]) -> int:
    """Span (anchored at :func:`head_starts`) or makespan of start times."""
    ends = [0] * problem.num_ranks
    for (op, s, _i), t in start.items():
        r = problem.stage_to_rank[s]
        ends[r] = max(ends[r], t + problem.duration(op, s))
    if problem.objective == "makespan":
        return max(ends)
    return max(e - h for e, h in zip(ends, head_starts(problem)))


def peak_memory(problem: ChunkProblem, orders: Sequence[RankOrder]) -> tuple[int, ...]:
    """Largest running sum of memory deltas along each rank's order."""
    peaks = []
    for order in orders:
        level = peak = 0
        for op, s, _i in order:
            level += problem.mem_delta(op, s)
            peak = max(peak, level)
        peaks.append(peak)
    return tuple(peaks)


def relabel_in_order(orders: Sequence[RankOrder]) -> list[list[tuple[str, int, int]]]:
    """Rename the k-th op of each (op, stage) group to microbatch k (module docstring)."""
    out = []
    for order in orders:
        seen: dict[tuple[str, int], int] = {}
        row = []
        for op, s, _i in order:
            k = seen.get((op, s), 0)
            row.append((op, s, k))
            seen[op, s] = k + 1
        out.append(row)
    return out


@dataclass(frozen=True)
class ChunkCpSat:
    """A built model: ``start[(op, stage, mb)]`` IntVars and the ``objective`` IntVar."""

    model: cp_model.CpModel
    start: dict[tuple[str, int, int], cp_model.IntVar]
    objective: cp_model.IntVar
    problem: ChunkProblem


def build_cpsat(problem: ChunkProblem) -> ChunkCpSat:
    """The CP-SAT model of ``problem`` (module docstring): intervals, NoOverlap and a memory
    reservoir per rank, dependencies with comm across ranks, in-order symmetry breaking."""
    m, horizon = problem.num_microbatches, problem.horizon()
    model = cp_model.CpModel()
    earliest, heads = _earliest(problem), head_starts(problem)
    start: dict[tuple[str, int, int], cp_model.IntVar] = {}
    per_rank: list[list] = [[] for _ in range(problem.num_ranks)]
    for s, r in enumerate(problem.stage_to_rank):
        for op in _OPS:
            dur = problem.duration(op, s)
            for i in range(m):
                # microbatch i of a group follows the i before it: i * dur later at least
                var = model.new_int_var(earliest[op, s] + i * dur, horizon, f"{op}{s}_{i}")
                start[op, s, i] = var
                per_rank[r].append(model.new_fixed_size_interval_var(var, dur, f"i{op}{s}_{i}"))
    for (op, s, i), var in start.items():
        for d, ds, delay in dependencies(problem, op, s, i):
            model.add(var >= start[d, ds, i] + problem.duration(d, ds) + delay)
        if i > 0:  # symmetry breaking: each (op, stage) in microbatch order
            model.add(var >= start[op, s, i - 1] + problem.duration(op, s))
    for r in range(problem.num_ranks):
        model.add(start["F", r, 0] == heads[r])  # ASAP first op (exact, see docstring)
        model.add_no_overlap(per_rank[r])
        if problem.mem_limit is not None:
            times = [start[op, s, i] for s in problem.stages_of(r) for op in _OPS for i in range(m)]
            deltas = [problem.mem_delta(op, s) for s in problem.stages_of(r) for op in _OPS
                      for _ in range(m)]  # fmt: skip
            low = min(0, sum(d for d in deltas if d < 0))
            model.add_reservoir_constraint(times, deltas, low, problem.mem_limit)
    objective = model.new_int_var(0, horizon, "objective")
    for s, r in enumerate(problem.stage_to_rank):
        offset = heads[r] if problem.objective == "span" else 0
        model.add(objective >= start["W", s, m - 1] + problem.duration("W", s) - offset)
    model.minimize(objective)
    return ChunkCpSat(model, start, objective, problem)
