"""Exhaustive search over schedules with several stages per rank (test helper).

Shares no code with :mod:`nobubble.pipeline.ilp.chunks`. A schedule is a per-*rank* order of
``(op, stage, microbatch)``; run as soon as possible every op gets a start time, and every
deadlock-free order tuple is exactly one sequence of its ops sorted by (start, rank) in which
each op's inputs come first. The search builds such sequences op by op with the (start, rank)
keys strictly increasing, so it visits every valid order tuple once; nothing assumes a
microbatch order, within a stage or across a rank's chunks. Transfers cost ``t_comm`` only
between stages on different ranks; memory is summed per rank. ``bound`` seeds branch and
bound (only schedules strictly better than it are looked for), and the prune (a rank cannot
end before its clock plus its remaining work) is obviously valid.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


def v_map(p: int) -> tuple[int, ...]:
    """Stage -> rank for two chunks in a V: 0..p-1 then p-1..0."""
    return tuple(range(p)) + tuple(reversed(range(p)))


def interleaved_map(p: int) -> tuple[int, ...]:
    return tuple(range(p)) * 2


@dataclass(frozen=True)
class ChunkedProblem:
    num_ranks: int
    num_microbatches: int
    stage_to_rank: tuple[int, ...]
    t_f: tuple[float, ...]  # per stage
    t_b: tuple[float, ...]
    t_w: tuple[float, ...]
    t_comm: float
    mem_f: tuple[float, ...]  # stored by F, per stage
    mem_b: tuple[float, ...]  # freed by B
    mem_w: tuple[float, ...]  # freed by W
    mem_limit: float | None = None
    objective: str = "span"


def search(problem: ChunkedProblem, *, bound: float = math.inf) -> float:
    """The least span (from each rank's earliest first forward) or makespan; ``inf`` when no
    schedule beats ``bound`` (or none fits the memory limit)."""
    P, S, m = problem.num_ranks, len(problem.stage_to_rank), problem.num_microbatches
    owner = problem.stage_to_rank
    dur = {"F": problem.t_f, "B": problem.t_b, "W": problem.t_w}
    mem = {"F": problem.mem_f, "B": tuple(-v for v in problem.mem_b),
           "W": tuple(-v for v in problem.mem_w)}  # fmt: skip

    def hop(a: int, b: int) -> float:
        return 0.0 if owner[a] == owner[b] else problem.t_comm

    # earliest start of each stage's F for microbatch alone; a rank's anchor is the earliest
    # over its stages (any of them could in principle run first)
    first_f = [0.0] * S
    for s in range(1, S):
        first_f[s] = first_f[s - 1] + problem.t_f[s - 1] + hop(s - 1, s)
    heads = [min(first_f[s] for s in range(S) if owner[s] == r) for r in range(P)]
    end: dict[tuple[str, int, int], float] = {}
    free, level = [0.0] * P, [0.0] * P
    left = [sum(m * (problem.t_f[s] + problem.t_b[s] + problem.t_w[s])
                for s in range(S) if owner[s] == r) for r in range(P)]  # fmt: skip
    best, found = [bound], [False]

    def ready_time(op: str, s: int, i: int) -> float | None:
        if op == "F":
            if s == 0:
                return 0.0
            e = end.get(("F", s - 1, i))
            return None if e is None else e + hop(s - 1, s)
        if op == "W":
            return end.get(("B", s, i))
        if ("F", s, i) not in end:
            return None
        if s == S - 1:
            return end["F", s, i]
        e = end.get(("B", s + 1, i))
        return None if e is None else max(e + hop(s + 1, s), end["F", s, i])

    def value(ends: list[float]) -> float:
        if problem.objective == "makespan":
            return max(ends)
        return max(ends[r] - heads[r] for r in range(P))

    def dfs(last: tuple[float, int], placed: int) -> None:
        if placed == 3 * S * m:
            if value(free) < best[0]:
                best[0], found[0] = value(free), True
            return
        ends = [max(free[r], last[0]) + left[r] if left[r] else free[r] for r in range(P)]
        if value(ends) >= best[0]:
            return
        moves = []
        for s in range(S):
            r = owner[s]
            for op in ("F", "B", "W"):
                for i in range(m):
                    if (op, s, i) in end:
                        continue
                    ready = ready_time(op, s, i)
                    if ready is None:
                        continue
                    start = max(free[r], ready)
                    if (start, r) <= last:
                        continue
                    limit = problem.mem_limit
                    if limit is not None and level[r] + mem[op][s] > limit + 1e-9:
                        continue
                    moves.append((start, r, op, s, i))
        moves.sort()
        for start, r, op, s, i in moves:
            saved = free[r]
            end[op, s, i] = free[r] = start + dur[op][s]
            level[r] += mem[op][s]
            left[r] -= dur[op][s]
            dfs((start, r), placed + 1)
            left[r] += dur[op][s]
            level[r] -= mem[op][s]
            del end[op, s, i]
            free[r] = saved

    dfs((-1.0, -1), 0)
    return best[0] if found[0] else math.inf
