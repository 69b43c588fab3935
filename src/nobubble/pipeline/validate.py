"""Is a schedule runnable? Completeness, per-rank order, and freedom from deadlock.

Dependencies of an action (stage s of S stages, microbatch i):

- ``F(s, i)`` needs ``F(s-1, i)`` (the activation from the previous stage), for s > 0;
- ``B(s, i)`` / ``BW(s, i)`` needs the backward of ``(s+1, i)`` (the gradient from the next
  stage) for s < S-1, and its own ``F(s, i)`` (the last stage starts its backward from the
  loss of its own forward);
- ``W(s, i)`` needs ``B(s, i)``.

Every (stage, microbatch) must have exactly one F and either one BW or one B and one W. Each
rank runs its list in order, so a schedule deadlocks when every unfinished rank's next action
waits for an action that can never run; :func:`validate` reports each such rank and what its
head action waits for.
"""

from __future__ import annotations

from collections import deque

from nobubble.pipeline.actions import Action, Op, Schedule

__all__ = ["ScheduleError", "validate", "check_complete", "dependencies", "DepKey", "dep_key"]

# Dependency keys: (kind, stage, microbatch) with kind 0 = forward done, 1 = input-gradient
# backward done (B or BW), 2 = W done. B and BW satisfy the same key.
DepKey = tuple[int, int, int]
_KIND = {Op.F: 0, Op.B: 1, Op.BW: 1, Op.W: 2}


class ScheduleError(ValueError):
    """A schedule that cannot run as written; the message names the offending action."""


def dep_key(action: Action) -> DepKey:
    """The key other actions use to wait for ``action``."""
    return (_KIND[action.op], action.stage, action.microbatch)


def dependencies(action: Action, num_stages: int) -> tuple[DepKey, ...]:
    """The keys ``action`` waits for (see the module docstring)."""
    s, i = action.stage, action.microbatch
    if action.op is Op.F:
        return ((0, s - 1, i),) if s > 0 else ()
    if action.op is Op.W:
        return ((1, s, i),)
    if s == num_stages - 1:
        return ((0, s, i),)
    return ((1, s + 1, i), (0, s, i))


def _describe(key: DepKey) -> str:
    kind, s, i = key
    return f"{'F' if kind == 0 else ('B' if kind == 1 else 'W')} of stage {s} microbatch {i}"


def check_complete(schedule: Schedule) -> None:
    """Every (stage, microbatch) has one F and one BW or one B + one W; no duplicates."""
    ops: dict[tuple[int, int], list[Op]] = {}
    for _, _, a in schedule.actions():
        ops.setdefault((a.stage, a.microbatch), []).append(a.op)
    for stage in range(schedule.num_stages):
        for mb in range(schedule.num_microbatches):
            _check_pair(stage, mb, ops.get((stage, mb), []))


def _check_pair(stage: int, mb: int, ops: list[Op]) -> None:
    has = set(ops)
    if len(has) != len(ops):
        op = next(op for op in has if ops.count(op) > 1)
        raise ScheduleError(
            f"action {Action(stage, op, mb)} appears {ops.count(op)} times; keep one"
        )
    if has in ({Op.F, Op.BW}, {Op.F, Op.B, Op.W}):
        return
    name = f"stage {stage} microbatch {mb}"
    if Op.F not in has:
        raise ScheduleError(f"{name} has no forward; add {Action(stage, Op.F, mb)}")
    if Op.BW in has:
        raise ScheduleError(
            f"{name} has both a fused backward {Action(stage, Op.BW, mb)} and a split "
            "one (I/W); keep one form"
        )
    if Op.W in has:
        raise ScheduleError(f"{name}: {Action(stage, Op.W, mb)} has no input-grad backward; "
                            f"add {Action(stage, Op.B, mb)}")  # fmt: skip
    if Op.B in has:
        raise ScheduleError(f"{name}: {Action(stage, Op.B, mb)} has no W; add "
                            f"{Action(stage, Op.W, mb)}")  # fmt: skip
    raise ScheduleError(
        f"{name} has no backward; add {Action(stage, Op.BW, mb)} or "
        f"{Action(stage, Op.B, mb)} + {Action(stage, Op.W, mb)}"
    )


def _check_order_and_deadlock(schedule: Schedule) -> None:
    """Run the schedule with dependencies only (no times); fail if some rank gets stuck."""
    num_stages = schedule.num_stages
    done: set[DepKey] = set()
    waiting: dict[DepKey, list[int]] = {}
    pos = [0] * schedule.num_ranks
    ready = deque(range(schedule.num_ranks))
    while ready:
        rank = ready.popleft()
        acts = schedule.rank_actions[rank]
        while pos[rank] < len(acts):
            action = acts[pos[rank]]
            missing = next((d for d in dependencies(action, num_stages) if d not in done), None)
            if missing is not None:
                waiting.setdefault(missing, []).append(rank)
                break
            key = dep_key(action)
            done.add(key)
            ready.extend(waiting.pop(key, ()))
            pos[rank] += 1
    stuck = [r for r in range(schedule.num_ranks) if pos[r] < len(schedule.rank_actions[r])]
    if not stuck:
        return
    lines = []
    for rank in stuck:
        action = schedule.rank_actions[rank][pos[rank]]
        missing = next(d for d in dependencies(action, num_stages) if d not in done)
        where = _where(schedule, missing)
        lines.append(f"rank {rank}: {action} waits for {_describe(missing)}{where}")
    raise ScheduleError("schedule deadlocks: " + "; ".join(lines))


def _where(schedule: Schedule, key: DepKey) -> str:
    """Where the awaited action sits: later on the same rank means a wrong per-rank order."""
    kind, stage, mb = key
    rank = schedule.stage_to_rank[stage]
    for pos, a in enumerate(schedule.rank_actions[rank]):
        if dep_key(a) == key:
            return f" (position {pos} on rank {rank})"
    return ""


def validate(schedule: Schedule) -> None:
    """Raise :class:`ScheduleError` if ``schedule`` is incomplete, has duplicates or cannot
    run to the end (wrong order on a rank, or a cycle of waits across ranks)."""
    check_complete(schedule)
    _check_order_and_deadlock(schedule)
