"""The ``static`` dispatch policy: every rank walks its precomputed order, with the
durations a :class:`~nobubble.pipeline.dispatch.perturb.Perturbation` gives.

This is :func:`nobubble.pipeline.simulate.simulate` with a duration per op instead of one
per stage (the same worklist: a rank advances until its next action waits for an input that
is not computed yet, then parks on it). With unperturbed durations both give the same
timeline to the last bit, which the tests check. :func:`timeline_result` turns any executed
timeline into the simulator's :class:`~nobubble.pipeline.simulate.SimResult`, so pictures
and summaries work on dispatched runs as on simulated ones.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence

from nobubble.pipeline.actions import Action, Schedule
from nobubble.pipeline.costs import CostModel
from nobubble.pipeline.simulate import SimResult, summarize
from nobubble.pipeline.validate import ScheduleError, dep_key, dependencies, validate

__all__ = ["run_static", "timeline_result"]

Timeline = tuple[list[list[float]], list[list[float]]]  # start[r][k], end[r][k]


def run_static(schedule: Schedule, duration: Callable[[Action], float], t_comm: float) -> Timeline:
    """Start and end of every action when each rank runs ``schedule`` in order.

    Args:
        schedule: the per-rank orders (any shape: chunks, fused backward).
        duration: the time ``duration(action)`` of each action.
        t_comm: the transfer time between two ranks (0 on one rank).
    Raises ScheduleError when the orders cannot run to the end.
    """
    owner, m = schedule.stage_to_rank, schedule.num_microbatches
    num_stages = schedule.num_stages

    def slot(key: tuple[int, int, int]) -> int:  # (kind, stage, microbatch) -> flat index
        return (key[0] * num_stages + key[1]) * m + key[2]

    finished: list[float | None] = [None] * (3 * num_stages * m)
    waiting: dict[int, list[int]] = {}
    plans = [
        [(tuple((slot(d), owner[d[1]] != rank) for d in dependencies(a, num_stages)),
          slot(dep_key(a)), duration(a)) for a in acts]
        for rank, acts in enumerate(schedule.rank_actions)
    ]  # fmt: skip
    start = [[0.0] * len(plan) for plan in plans]
    end = [[0.0] * len(plan) for plan in plans]
    pos, free_at = [0] * schedule.num_ranks, [0.0] * schedule.num_ranks
    ready = deque(range(schedule.num_ranks))
    while ready:
        rank = ready.popleft()
        plan, k, t = plans[rank], pos[rank], free_at[rank]
        while k < len(plan):
            deps, own, took = plan[k]
            t_start, blocked = t, -1
            for dep, crosses in deps:
                done_at = finished[dep]
                if done_at is None:
                    blocked = dep
                    break
                t_start = max(t_start, done_at + t_comm if crosses else done_at)
            if blocked >= 0:
                waiting.setdefault(blocked, []).append(rank)
                break
            start[rank][k] = t_start
            end[rank][k] = t = finished[own] = t_start + took
            ready.extend(waiting.pop(own, ()))
            k += 1
        pos[rank], free_at[rank] = k, t
    if any(pos[r] < len(plan) for r, plan in enumerate(plans)):
        validate(schedule)  # names the stuck actions
        raise ScheduleError(f"schedule {schedule.name!r} cannot run to the end")
    return start, end


def timeline_result(
    schedule: Schedule, costs: CostModel, start: Sequence[Sequence[float]],
    end: Sequence[Sequence[float]],
) -> SimResult:  # fmt: skip
    """The simulator's summary of an executed timeline (``costs`` one entry per stage).

    Work per rank (``busy``) is the time its ops really took, so a straggler's rank is the
    busiest one and the bubble rate measures idle time against it, as the simulator does
    for ranks of unequal cost.
    """
    return summarize(schedule, costs, start, end)
