"""An independent exhaustive search over pipeline schedules (test helper for the ILP).

It shares no code with :mod:`nobubble.pipeline.ilp.model`. A schedule (one stage per rank) is
a per-stage order of F/B/W ops; run as soon as possible, every op gets a start time. Every
deadlock-free order tuple corresponds to exactly one sequence of its ops sorted by (start,
stage), and in that sequence each op's inputs come before it. The search builds such
sequences op by op, computing each start on the way and keeping the (start, stage) keys
strictly increasing, so it visits every valid order tuple exactly once; nothing assumes a
microbatch order. ``prune=True`` adds branch and bound with an obviously valid bound (a
stage cannot end before its current time plus its remaining work), which changes the work,
not the optimum.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Problem:
    num_stages: int
    num_microbatches: int
    t_f: tuple[float, ...]
    t_b: tuple[float, ...]
    t_w: tuple[float, ...]
    t_comm: float
    mem_f: tuple[float, ...]  # stored by F
    mem_b: tuple[float, ...]  # freed by B
    mem_w: tuple[float, ...]  # freed by W
    mem_limit: float | None = None
    objective: str = "span"


@dataclass(frozen=True)
class Optimum:
    value: float
    orders: tuple[tuple[tuple[str, int], ...], ...]
    num_leaves: int  # complete schedules reached (all valid ones when prune=False)


def all_orders(problem: Problem) -> list[tuple[tuple[tuple[str, int], ...], ...]]:
    """Every valid (deadlock-free, within the memory limit) order tuple."""
    found: list = []
    search(problem, prune=False, collect=found)
    return found


def search(problem: Problem, *, prune: bool = True, collect: list | None = None) -> Optimum:
    p, m = problem.num_stages, problem.num_microbatches
    dur = {"F": problem.t_f, "B": problem.t_b, "W": problem.t_w}
    mem = {
        "F": problem.mem_f,
        "B": tuple(-v for v in problem.mem_b),
        "W": tuple(-v for v in problem.mem_w),
    }
    end: dict[tuple[str, int, int], float] = {}
    orders: list[list[tuple[str, int]]] = [[] for _ in range(p)]
    free = [0.0] * p
    first = [None] * p
    level = [0.0] * p
    left = [m * (problem.t_f[s] + problem.t_b[s] + problem.t_w[s]) for s in range(p)]
    best = {"value": math.inf, "orders": None, "leaves": 0}

    def ready_time(op: str, s: int, i: int) -> float | None:
        if op == "F":
            if s == 0:
                return 0.0
            e = end.get(("F", s - 1, i))
            return None if e is None else e + problem.t_comm
        if op == "B":
            if s == p - 1:
                return end.get(("F", s, i))
            e = end.get(("B", s + 1, i))
            return None if e is None or ("F", s, i) not in end else e + problem.t_comm
        return end.get(("B", s, i))

    heads = [sum(problem.t_f[k] + problem.t_comm for k in range(s)) for s in range(p)]

    def value() -> float:
        if problem.objective == "makespan":
            return max(free)
        if problem.objective == "raw_span":
            return max(free[s] - first[s] for s in range(p))
        return max(free[s] - heads[s] for s in range(p))

    def bound(now: float) -> float:
        ends = [max(free[s], now) + left[s] if left[s] else free[s] for s in range(p)]
        if problem.objective == "makespan":
            return max(ends)
        if problem.objective == "raw_span":
            return max(ends[s] - (first[s] if first[s] is not None else now) for s in range(p))
        return max(ends[s] - heads[s] for s in range(p))

    def dfs(last: tuple[float, int], placed: int) -> None:
        if placed == 3 * m * p:
            best["leaves"] += 1
            if collect is not None:
                collect.append(tuple(tuple(o) for o in orders))
            v = value()
            if v < best["value"]:
                best["value"], best["orders"] = v, tuple(tuple(o) for o in orders)
            return
        if prune and bound(last[0]) >= best["value"]:
            return
        moves = []
        for s in range(p):
            for op in ("F", "B", "W"):
                for i in range(m):
                    if (op, s, i) in end:
                        continue
                    ready = ready_time(op, s, i)
                    if ready is None:
                        continue
                    start = max(free[s], ready)
                    if (start, s) <= last:
                        continue
                    if (
                        problem.mem_limit is not None
                        and level[s] + mem[op][s] > problem.mem_limit + 1e-9
                    ):
                        continue
                    moves.append((start, s, op, i))
        moves.sort()
        for start, s, op, i in moves:
            saved = (free[s], first[s], level[s])
            end[op, s, i] = free[s] = start + dur[op][s]
            if op == "F" and first[s] is None:
                first[s] = start
            level[s] += mem[op][s]
            left[s] -= dur[op][s]
            orders[s].append((op, i))
            dfs((start, s), placed + 1)
            orders[s].pop()
            left[s] += dur[op][s]
            del end[op, s, i]
            free[s], first[s], level[s] = saved

    dfs((-1.0, -1), 0)
    return Optimum(best["value"], best["orders"], best["leaves"])
