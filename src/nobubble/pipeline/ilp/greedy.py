"""A memory-capped list scheduler on :class:`~nobubble.pipeline.ilp.chunks.ChunkProblem`.

It gives the exact solver a warm start where no published schedule fits the memory limit
(interleaved placements under 1F1B's memory, tight V limits). Ops are placed one at a time
in order of their earliest start over all ranks (so starts never decrease); ties go by
``priority`` (``"bfw"``: B, then F, then W, which leaves Ws to fill waits; ``"bwf"``: W
before F, which frees memory first), then the older microbatch, then the later stage.

Memory: a microbatch is *admitted* to a rank by the forward of the rank's first stage, and
only if the rank can then still store the forwards of all its later stages for every
admitted microbatch (``level + reserved <= limit``). Invariant: ``level + reserved <=
mem_limit`` at every step, so a later-stage forward always fits and an admitted microbatch
can always go on; a microbatch admitted on the last rank it visits is admitted everywhere,
so it runs to its last W, freeing memory, and the schedule never deadlocks when one
microbatch fits on every rank. Returns None when it does not (the limit is below one
microbatch's activations on some rank).
"""

from __future__ import annotations

from nobubble.pipeline.ilp.chunks import ChunkProblem, dependencies

__all__ = ["greedy_orders"]

_PRIORITIES = {"bfw": {"B": 0, "F": 1, "W": 2}, "bwf": {"B": 0, "W": 1, "F": 2}}


def _dependents(problem: ChunkProblem, op: str, s: int) -> list[tuple[str, int]]:
    last = problem.num_stages - 1
    if op == "F":
        return [("F", s + 1), ("B", s)] if s < last else [("B", s)]
    if op == "B":
        return [("W", s)] + ([("B", s - 1)] if s > 0 else [])
    return []


def greedy_orders(
    problem: ChunkProblem, *, priority: str = "bfw"
) -> list[list[tuple[str, int, int]]] | None:
    """Per-rank orders ``[(op, stage, mb), ...]`` (module docstring), or None."""
    if priority not in _PRIORITIES:
        raise ValueError(f"priority={priority!r}; use one of {sorted(_PRIORITIES)}")
    rank_of, m, limit = problem.stage_to_rank, problem.num_microbatches, problem.mem_limit
    stages = [problem.stages_of(r) for r in range(problem.num_ranks)]
    later_f = [sum(problem.mem_f[s] for s in st[1:]) for st in stages]  # reserved per admission
    if limit is not None and any(sum(problem.mem_f[s] for s in st) > limit for st in stages):
        return None
    rank_pri = _PRIORITIES[priority]
    end: dict[tuple[str, int, int], int] = {}
    enabled: set[tuple[str, int, int]] = {("F", 0, i) for i in range(m)}
    free = [0] * problem.num_ranks
    level, reserved = [0] * problem.num_ranks, [0] * problem.num_ranks
    orders: list[list[tuple[str, int, int]]] = [[] for _ in stages]
    while enabled:
        best = None
        for op, s, i in enabled:
            r = rank_of[s]
            admits = op == "F" and s == stages[r][0]
            need = level[r] + reserved[r] + problem.mem_f[s] + later_f[r]
            if admits and limit is not None and need > limit:
                continue  # the microbatch is not admitted to this rank yet
            ready = max((end[d, ds, i] + delay for d, ds, delay in dependencies(problem, op, s, i)),
                        default=0)  # fmt: skip
            key = (max(free[r], ready), rank_pri[op], i, -s)
            if best is None or key < best[0]:
                best = (key, op, s, i)
        if best is None:
            return None  # unreachable when one microbatch fits (module docstring)
        (t, *_), op, s, i = best
        r = rank_of[s]
        enabled.discard((op, s, i))
        end[op, s, i] = free[r] = t + problem.duration(op, s)
        level[r] += problem.mem_delta(op, s)
        if op == "F":
            reserved[r] += later_f[r] if s == stages[r][0] else -problem.mem_f[s]
        orders[r].append((op, s, i))
        for d, ds in _dependents(problem, op, s):
            if all((x, xs, i) in end for x, xs, _ in dependencies(problem, d, ds, i)):
                enabled.add((d, ds, i))
    return orders
