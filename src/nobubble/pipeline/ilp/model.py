"""The exact pipeline scheduling problem in integer units (:class:`IntProblem`), and its
CP-SAT model over *stage orders* (one list of ``(op, microbatch)`` per stage, ``op`` in
``"F" "B" "W"``); :mod:`nobubble.pipeline.ilp.solve` converts to and from the public types.

One stage per rank, the Zero Bubble graph: dependencies with ``t_comm`` between stages, one
op at a time per stage, activation memory as a reservoir (deltas at op starts, running sum
at most ``mem_limit``). Objective ``span`` (max over stages of last end - ``head[s]``,
``head[s] = sum_{s'<s} (t_f[s'] + t_comm)``, ``F[s,0]`` fixed there) or ``makespan``. F, B
and W of each stage run in microbatch order, which keeps an optimum
(:func:`relabel_in_order`); the proofs are in docs/pipeline/ilp.md.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import cast

from ortools.sat.python import cp_model

__all__ = [
    "IntProblem",
    "StageOrder",
    "CpSatModel",
    "build_cpsat",
    "asap_times",
    "objective_of",
    "relabel_in_order",
    "head_starts",
    "peak_memory",
]

StageOrder = Sequence[tuple[str, int]]
"""One stage's ops in execution order: ``[("F", 0), ("F", 1), ("B", 0), ...]``."""

_OPS = ("F", "B", "W")


@dataclass(frozen=True, kw_only=True)
class PerStageCosts:
    """The integer costs both exact problems hold, one entry per stage, and their lookups
    (:class:`IntProblem`, one stage per rank, and the several-chunk
    :class:`~nobubble.pipeline.ilp.chunks.ChunkProblem`).

    Attributes:
        num_microbatches: m.
        t_f, t_b, t_w: per-stage durations (ticks >= 0). t_comm: transfer between ranks.
        mem_f, mem_b, mem_w: per-stage memory *deltas* of each op (F's store > 0, B/W's
            frees usually < 0), in mem units.
        mem_limit: per-rank limit on the running sum in the same units, or None.
        objective: ``"span"`` or ``"makespan"``.
    """

    num_microbatches: int
    t_f: tuple[int, ...]
    t_b: tuple[int, ...]
    t_w: tuple[int, ...]
    t_comm: int
    mem_f: tuple[int, ...]
    mem_b: tuple[int, ...]
    mem_w: tuple[int, ...]
    mem_limit: int | None = None
    objective: str = "span"

    def _check_per_stage(self, num_stages: int) -> None:
        """Make the per-stage fields int tuples of ``num_stages`` entries; refuse negative
        durations and an unknown objective."""
        for name in ("t_f", "t_b", "t_w", "mem_f", "mem_b", "mem_w"):
            value = tuple(int(v) for v in getattr(self, name))
            if len(value) != num_stages:
                raise ValueError(f"{name} has {len(value)} entries; give one per stage "
                                 f"({num_stages})")  # fmt: skip
            object.__setattr__(self, name, value)
        if min(self.t_f + self.t_b + self.t_w) < 0 or self.t_comm < 0:
            raise ValueError("durations and t_comm must be >= 0")
        if self.objective not in ("span", "makespan"):
            raise ValueError(f"objective={self.objective!r}; use 'span' or 'makespan'")

    def duration(self, op: str, stage: int) -> int:
        return {"F": self.t_f, "B": self.t_b, "W": self.t_w}[op][stage]

    def mem_delta(self, op: str, stage: int) -> int:
        return {"F": self.mem_f, "B": self.mem_b, "W": self.mem_w}[op][stage]

    def horizon(self) -> int:
        """An upper bound on any ASAP end time: all ops one after another, every hop paid."""
        m, num_stages = self.num_microbatches, len(self.t_f)
        work = m * (sum(self.t_f) + sum(self.t_b) + sum(self.t_w))
        return work + 2 * m * num_stages * self.t_comm + 1


@dataclass(frozen=True, kw_only=True)
class IntProblem(PerStageCosts):
    """The scheduling problem in integer units (durations in ticks, memory in mem units),
    one stage per rank: ``num_stages`` p, every per-stage field (:class:`PerStageCosts`) a
    tuple of p ints, ``t_comm`` between adjacent stages, ``mem_limit`` per stage."""

    num_stages: int

    def __post_init__(self) -> None:
        p, m = self.num_stages, self.num_microbatches
        if p < 1 or m < 1:
            raise ValueError(f"num_stages={p}, num_microbatches={m}: both must be >= 1")
        self._check_per_stage(p)


def head_starts(problem: IntProblem) -> tuple[int, ...]:
    """ASAP start of each stage's first F: ``sum_{s'<s} (t_f[s'] + t_comm)``."""
    heads, t = [], 0
    for s in range(problem.num_stages):
        heads.append(t)
        t += problem.t_f[s] + problem.t_comm
    return tuple(heads)


def _dependency(
    problem: IntProblem, op: str, stage: int, mb: int
) -> tuple[str, int, int, int] | None:
    """``(op, stage, microbatch, delay)`` this op waits for, or None (F of stage 0)."""
    p = problem.num_stages
    if op == "F":
        return None if stage == 0 else ("F", stage - 1, mb, problem.t_comm)
    if op == "B":
        return ("F", stage, mb, 0) if stage == p - 1 else ("B", stage + 1, mb, problem.t_comm)
    return ("B", stage, mb, 0)


def asap_times(
    problem: IntProblem, orders: Sequence[StageOrder]
) -> dict[tuple[str, int, int], int]:
    """Run ``orders`` as soon as possible; return the start tick of every ``(op, stage, mb)``.

    Raises ValueError on a deadlock (a stage waits for an op that is behind it) or on an
    order that does not hold each op exactly once.
    """
    p, m = problem.num_stages, problem.num_microbatches
    if len(orders) != p:
        raise ValueError(f"{len(orders)} stage orders for {p} stages")
    for s, order in enumerate(orders):
        if sorted(order) != sorted((op, i) for op in _OPS for i in range(m)):
            raise ValueError(f"stage {s} order does not hold F, B, W of each microbatch once")
    start: dict[tuple[str, int, int], int] = {}
    pos, free = [0] * p, [0] * p
    remaining = 3 * m * p
    while remaining:
        progressed = False
        for s in range(p):
            while pos[s] < len(orders[s]):
                op, mb = orders[s][pos[s]]
                dep = _dependency(problem, op, s, mb)
                ready = 0
                if dep is not None:
                    dop, ds, dmb, delay = dep
                    if (dop, ds, dmb) not in start:
                        break
                    ready = start[dop, ds, dmb] + problem.duration(dop, ds) + delay
                start[op, s, mb] = max(free[s], ready)
                free[s] = start[op, s, mb] + problem.duration(op, s)
                pos[s] += 1
                remaining -= 1
                progressed = True
        if not progressed:
            stuck = [
                f"stage {s} at {orders[s][pos[s]]}" for s in range(p) if pos[s] < len(orders[s])
            ]
            raise ValueError(f"stage orders deadlock: {', '.join(stuck)}")
    return start


def objective_of(
    problem: IntProblem, start: dict[tuple[str, int, int], int], objective: str | None = None
) -> int:
    """Span (max over stages of last end - first F start) or makespan of ASAP start times."""
    objective = objective or problem.objective
    ends = [0] * problem.num_stages
    firsts: list[int | None] = [None] * problem.num_stages
    for (op, s, _mb), t in start.items():
        ends[s] = max(ends[s], t + problem.duration(op, s))
        if op == "F":
            first = firsts[s]
            firsts[s] = t if first is None else min(first, t)
    if objective == "makespan":
        return max(ends)
    # Every stage runs an F for each microbatch, so no entry is still None here.
    return max(e - f for e, f in zip(ends, cast("list[int]", firsts)))


def peak_memory(problem: IntProblem, orders: Sequence[StageOrder]) -> tuple[int, ...]:
    """Largest running sum of memory deltas along each stage's order."""
    peaks = []
    for s, order in enumerate(orders):
        level, peak = 0, 0
        for op, _mb in order:
            level += problem.mem_delta(op, s)
            peak = max(peak, level)
        peaks.append(peak)
    return tuple(peaks)


def relabel_in_order(orders: Sequence[StageOrder]) -> list[list[tuple[str, int]]]:
    """Rename the k-th F (B, W) of every stage to microbatch k (see the module docstring)."""
    out = []
    for order in orders:
        seen = dict.fromkeys(_OPS, 0)
        row = []
        for op, _mb in order:
            row.append((op, seen[op]))
            seen[op] += 1
        out.append(row)
    return out


@dataclass(frozen=True)
class CpSatModel:
    """A built CP-SAT model and handles to its variables.

    ``start[(op, s, i)]`` is the start IntVar of op ``op`` of stage s on microbatch i;
    ``objective`` is the IntVar minimised.
    """

    model: cp_model.CpModel
    start: dict[tuple[str, int, int], cp_model.IntVar]
    objective: cp_model.IntVar
    problem: IntProblem


def build_cpsat(
    problem: IntProblem, *, memory: str = "reservoir", implied: bool = True
) -> CpSatModel:
    """Build the CP-SAT model of ``problem`` (see the module docstring for the formulation).

    ``memory`` picks the encoding of the activation limit: ``"reservoir"`` (the default: a
    reservoir of the deltas at op starts; exact for any deltas), ``"cumulative"`` (each
    microbatch holds ``-mem_b`` from its F to its B and ``-mem_w`` from its F to its W; exact
    when ``mem_b, mem_w <= 0`` and ``mem_f + mem_b + mem_w == 0``, otherwise the reservoir is
    used) or ``"both"``. The reservoir is the default because it is exact for any deltas;
    the others are kept to compare against it.
    ``implied`` adds the precedences the memory limit forces (:func:`_implied_by_memory`);
    they cut no schedule and help the search.
    """
    p, m = problem.num_stages, problem.num_microbatches
    model = cp_model.CpModel()
    horizon = problem.horizon()
    heads = head_starts(problem)
    start: dict[tuple[str, int, int], cp_model.IntVar] = {}
    intervals: dict[tuple[str, int, int], cp_model.IntervalVar] = {}
    for s in range(p):
        for op in _OPS:
            dur = problem.duration(op, s)
            for i in range(m):
                lo = heads[s] if op == "F" else 0
                var = model.new_int_var(lo, horizon, f"{op}{s}_{i}")
                start[op, s, i] = var
                intervals[op, s, i] = model.new_fixed_size_interval_var(var, dur, f"i{op}{s}_{i}")
        model.add(start["F", s, 0] == heads[s])  # ASAP first F (exact, see docstring)
        model.add_no_overlap([intervals[op, s, i] for op in _OPS for i in range(m)])

    def end(op: str, s: int, i: int):
        return start[op, s, i] + problem.duration(op, s)

    for s in range(p):
        for op in _OPS:
            for i in range(m):
                dep = _dependency(problem, op, s, i)
                if dep is not None:
                    dop, ds, dmb, delay = dep
                    model.add(start[op, s, i] >= end(dop, ds, dmb) + delay)
                if i > 0:  # symmetry breaking: each op kind in microbatch order
                    model.add(start[op, s, i] >= end(op, s, i - 1))
    if problem.mem_limit is not None:
        for s in range(p):
            _add_memory(model, problem, s, start, horizon, memory)
            if implied:
                for op, j, i in _implied_by_memory(problem, s):
                    model.add(start["F", s, i] >= end(op, s, j))

    objective = model.new_int_var(0, horizon, "objective")
    for s in range(p):
        offset = heads[s] if problem.objective == "span" else 0
        model.add(objective >= end("W", s, m - 1) - offset)
    model.minimize(objective)
    return CpSatModel(model, start, objective, problem)


def _add_memory(model, problem: IntProblem, s: int, start, horizon: int, memory: str) -> None:
    if memory not in ("cumulative", "reservoir", "both"):
        raise ValueError(f"memory={memory!r}; use 'reservoir', 'cumulative' or 'both'")
    m, limit = problem.num_microbatches, problem.mem_limit
    mf, mb, mw = problem.mem_f[s], problem.mem_b[s], problem.mem_w[s]
    if memory in ("cumulative", "both") and mb <= 0 and mw <= 0 and mf + mb + mw == 0:
        intervals, demands = [], []
        for i in range(m):
            for op, held in (("B", -mb), ("W", -mw)):
                if held == 0:
                    continue
                size = model.new_int_var(0, horizon, f"hold{op}{s}_{i}")
                intervals.append(
                    model.new_interval_var(start["F", s, i], size, start[op, s, i], f"m{op}{s}_{i}")
                )
                demands.append(held)
        if intervals:
            model.add_cumulative(intervals, demands, limit)
        if memory == "cumulative":
            return
    times, deltas = [], []
    for op, delta in (("F", mf), ("B", mb), ("W", mw)):
        for i in range(m):
            times.append(start[op, s, i])
            deltas.append(delta)
    low = min(0, sum(min(d, 0) for d in deltas))
    model.add_reservoir_constraint(times, deltas, low, limit)


def _implied_by_memory(problem: IntProblem, s: int) -> list[tuple[str, int, int]]:
    """``(op, j, i)``: op j (B or W) of stage s must end before F i starts, or F i breaks
    the limit.

    In order, when F_i starts with nB of the Bs and nW of the Ws done (nW <= nB <= i), the
    stage holds ``(i+1) mem_f + nB mem_b + nW mem_w`` (mem_b, mem_w < 0). With every B
    done it still needs ``nW >= ceil(((i+1) mem_f + i mem_b - limit) / -mem_w)``; with
    nW = nB it needs ``nB >= ceil(((i+1) mem_f - limit) / (-mem_b - mem_w))``. Only valid for
    the usual signs (mem_b, mem_w < 0), otherwise nothing is implied.
    """
    mf, mb, mw, limit = problem.mem_f[s], problem.mem_b[s], problem.mem_w[s], problem.mem_limit
    if limit is None or mb >= 0 or mw >= 0 or mf <= 0:
        return []
    out = []
    for i in range(problem.num_microbatches):
        need_w = -(-((i + 1) * mf + i * mb - limit) // -mw)  # ceil division
        need_b = -(-((i + 1) * mf - limit) // (-mb - mw))
        if 1 <= need_w <= i:
            out.append(("W", need_w - 1, i))
        if 1 <= need_b <= i:
            out.append(("B", need_b - 1, i))
    return out
