"""Event-driven simulation of a schedule: op times, bubbles and activation memory.

Each rank runs its actions in order; an action starts as soon as its rank is free and every
input it needs has arrived (dependencies in :mod:`nobubble.pipeline.validate`). An input made
on another rank arrives ``t_comm`` after its producer ends; on the same rank it is ready at
once. The simulation is a worklist over ranks: a rank advances until its next action waits
for something not yet computed, then parks on that key until it is produced, so every action
is visited a constant number of times (linear in the number of actions).

Definitions (the Zero Bubble paper's):

- span of a rank: from the start of its first op to the end of its last op;
- ``bubble_rate = (max span - work) / max span`` with ``work = m * (T_F + T_B + T_W)``
  summed over the rank's stages (the busiest rank's work when costs differ per rank);
- per-rank bubble: ``(span_r - work_r) / span_r``;
- memory: F adds ``mem_f``, B frees ``mem_b``, W frees ``mem_w``; a rank's peak is the
  largest running total over its actions (with recompute, also the level during each B,
  :meth:`~nobubble.pipeline.costs.CostModel.memory_transient`). The 1F1B reference of rank r is
  ``min(p - r, m) * M_F(r)`` (1F1B keeps p - r microbatches in flight on rank r), where
  ``M_F(r)`` sums ``mem_f`` over the rank's stages.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from nobubble.pipeline.actions import Action, Schedule
from nobubble.pipeline.costs import CostModel
from nobubble.pipeline.validate import (
    DepKey,
    ScheduleError,
    check_complete,
    dep_key,
    dependencies,
    validate,
)

__all__ = ["SimResult", "simulate", "summarize", "run_timeline", "per_stage_costs", "plan_peaks"]


@dataclass(frozen=True, slots=True)
class SimResult:
    """Timeline and summary of one simulated schedule.

    ``start[r][k]`` / ``end[r][k]`` are the times of ``schedule.rank_actions[r][k]``. Ranks
    are the paper's "stages" (devices); per-rank tuples have ``num_ranks`` entries.
    """

    schedule: Schedule
    costs: CostModel
    start: tuple[tuple[float, ...], ...]
    end: tuple[tuple[float, ...], ...]
    makespan: float
    spans: tuple[float, ...]
    busy: tuple[float, ...]
    bubble_rate: float
    rank_bubble_rates: tuple[float, ...]
    peak_memory: tuple[float, ...]
    peak_memory_1f1b: tuple[float, ...]

    @property
    def max_span(self) -> float:
        return max(self.spans)

    @property
    def bubble_time(self) -> float:
        """``max span - work``: the idle time of the paper's definition."""
        return self.max_span - max(self.busy)

    @property
    def peak_memory_vs_1f1b(self) -> tuple[float, ...]:
        """Each rank's peak activation memory relative to its 1F1B peak."""
        return tuple(
            p / ref if ref > 0 else 0.0 for p, ref in zip(self.peak_memory, self.peak_memory_1f1b)
        )

    @property
    def max_peak_memory_vs_1f1b(self) -> float:
        """Largest per-rank peak over the largest 1F1B peak (rank 0's p * M_F)."""
        ref = max(self.peak_memory_1f1b)
        return max(self.peak_memory) / ref if ref > 0 else 0.0

    def timing(self, action: Action) -> tuple[float, float]:
        """``(start, end)`` of one action."""
        rank = self.schedule.stage_to_rank[action.stage]
        k = self.schedule.rank_actions[rank].index(action)
        return self.start[rank][k], self.end[rank][k]

    def summary(self) -> dict:
        """JSON-ready figures (no per-action timeline)."""
        return {
            "schedule": self.schedule.name,
            "stages": self.schedule.num_ranks,
            "chunks": self.schedule.num_chunks,
            "microbatches": self.schedule.num_microbatches,
            "makespan": self.makespan,
            "max_span": self.max_span,
            "bubble_rate": self.bubble_rate,
            "rank_bubble_rates": list(self.rank_bubble_rates),
            "peak_memory": list(self.peak_memory),
            "peak_memory_vs_1f1b": list(self.peak_memory_vs_1f1b),
            "max_peak_memory_vs_1f1b": self.max_peak_memory_vs_1f1b,
        }


def simulate(schedule: Schedule, costs: CostModel, *, check: bool = True) -> SimResult:
    """Simulate ``schedule`` under ``costs`` (one cost entry per stage of the schedule, or
    one per rank, which is then split over the rank's chunks).

    Raises :class:`~nobubble.pipeline.validate.ScheduleError` if the schedule is invalid:
    incomplete (checked first when ``check=True``) or stuck (always detected by the run).
    """
    costs = per_stage_costs(schedule, costs)
    if check:
        check_complete(schedule)  # order and deadlocks are checked by the run itself
    start, end = run_timeline(schedule, costs.duration, costs.t_comm)
    return summarize(schedule, costs, start, end)


def per_stage_costs(schedule: Schedule, costs: CostModel) -> CostModel:
    """``costs`` with one entry per stage of ``schedule``: as given, or each rank's split
    over its chunks (:meth:`~nobubble.pipeline.costs.CostModel.for_stages`).

    Raises:
        ValueError: ``costs`` has neither one entry per stage nor one per rank.
    """
    if costs.num_stages == schedule.num_stages:
        return costs
    if costs.num_stages != schedule.num_ranks:
        raise ValueError(
            f"costs have {costs.num_stages} stages but schedule {schedule.name!r} has "
            f"{schedule.num_stages} stages on {schedule.num_ranks} ranks; give one cost "
            "per stage or per rank"
        )
    return costs.for_stages(schedule.stage_to_rank)


def plan_peaks(plan: Schedule, costs: CostModel) -> tuple[float, ...]:
    """Each rank's peak activation memory when it runs ``plan`` in order (``costs`` one entry
    per stage)."""
    peaks = []
    for acts in plan.rank_actions:
        level = peak = 0.0
        for a in acts:
            peak = max(peak, level + costs.memory_transient(a))
            level += costs.memory_delta(a)
            peak = max(peak, level)
        peaks.append(peak)
    return tuple(peaks)


def run_timeline(
    schedule: Schedule, duration: Callable[[Action], float], t_comm: float
) -> tuple[list[list[float]], list[list[float]]]:
    """``(start, end)`` per rank and action when each rank runs ``schedule`` in order, each
    action taking ``duration(action)`` and every transfer between ranks ``t_comm`` (the
    worklist of the module docstring). Raises ScheduleError when the orders cannot finish."""
    num_stages, owner = schedule.num_stages, schedule.stage_to_rank
    m = schedule.num_microbatches

    def index(key: DepKey) -> int:  # (kind, stage, microbatch) -> slot in a flat table
        return (key[0] * num_stages + key[1]) * m + key[2]

    finished: list[float | None] = [None] * (3 * num_stages * m)
    waiting: dict[int, list[int]] = {}
    # per rank: (dependencies as (slot, crosses ranks), own slot, duration), computed once
    plans = [
        [
            (
                tuple((index(d), owner[d[1]] != rank) for d in dependencies(a, num_stages)),
                index(dep_key(a)),
                duration(a),
            )
            for a in acts
        ]
        for rank, acts in enumerate(schedule.rank_actions)
    ]
    start = [[0.0] * len(a) for a in plans]
    end = [[0.0] * len(a) for a in plans]
    free_at = [0.0] * schedule.num_ranks
    pos = [0] * schedule.num_ranks
    ready = deque(range(schedule.num_ranks))
    while ready:
        rank = ready.popleft()
        plan, k, t = plans[rank], pos[rank], free_at[rank]
        starts, ends = start[rank], end[rank]
        while k < len(plan):
            deps, slot, took = plan[k]
            t_start, blocked = t, -1
            for dep, crosses in deps:
                done_at = finished[dep]
                if done_at is None:
                    blocked = dep
                    break
                if crosses:
                    done_at += t_comm
                if done_at > t_start:
                    t_start = done_at
            if blocked >= 0:
                waiting.setdefault(blocked, []).append(rank)
                break
            starts[k] = t_start
            ends[k] = t = finished[slot] = t_start + took
            if slot in waiting:
                ready.extend(waiting.pop(slot))
            k += 1
        pos[rank], free_at[rank] = k, t
    if any(pos[r] < len(a) for r, a in enumerate(plans)):
        validate(schedule)  # names the stuck actions
        raise ScheduleError(f"schedule {schedule.name!r} cannot run to the end")
    return start, end


def summarize(
    schedule: Schedule,
    costs: CostModel,
    start: Sequence[Sequence[float]],
    end: Sequence[Sequence[float]],
) -> SimResult:
    """The summary of a timeline (``start[r][k]``/``end[r][k]`` of ``rank_actions[r][k]``,
    ``costs`` one entry per stage): spans, busy time (what the ops really took), bubble rate
    and peak memory, by the definitions in the module docstring."""
    p, m = schedule.num_ranks, schedule.num_microbatches
    spans, busy, refs = [], [], []
    for r, acts in enumerate(schedule.rank_actions):
        spans.append(max(end[r]) - min(start[r]) if acts else 0.0)
        busy.append(sum(e - s for s, e in zip(start[r], end[r])))
        rank_mem_f = sum(costs.mem_f[s] for s in schedule.stages_of(r))
        refs.append(min(p - r, m) * rank_mem_f)
    max_span = max(spans)
    return SimResult(
        schedule=schedule,
        costs=costs,
        start=tuple(map(tuple, start)),
        end=tuple(map(tuple, end)),
        makespan=max(max(e) for e in end if e) - min(min(s) for s in start if s),
        spans=tuple(spans),
        busy=tuple(busy),
        bubble_rate=(max_span - max(busy)) / max_span if max_span > 0 else 0.0,
        rank_bubble_rates=tuple((s - b) / s if s > 0 else 0.0 for s, b in zip(spans, busy)),
        peak_memory=plan_peaks(schedule, costs),
        peak_memory_1f1b=tuple(refs),
    )
