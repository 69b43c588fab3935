"""validate against broken copies of valid schedules: every mutation must be refused.

A valid schedule from the registry (every generator, p <= 4 ranks, m <= 8 microbatches) is
mutated in one of three ways, each of which no runnable schedule survives:

- drop one action: its (stage, microbatch) lacks an F, a backward, or the W or B of a split;
- duplicate one action anywhere on its own rank: the copy runs the op twice;
- swap two actions on one rank where the later one waits for the earlier (an F and the
  backward of its microbatch, a B and its W, two chunks' F of a V): the waiting one now sits
  at the head of its rank and what it waits for sits behind it, so the rank is stuck.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nobubble.pipeline.actions import Action, Schedule
from nobubble.pipeline.validate import ScheduleError, dep_key, dependencies, validate
from tests.pipeline.registry_schedules import valid_schedules


def _with_rank(sched: Schedule, rank: int, actions: list[Action]) -> Schedule:
    rows = list(sched.rank_actions)
    rows[rank] = tuple(actions)
    return Schedule(f"{sched.name}+mutated", sched.num_microbatches, sched.stage_to_rank, rows)


def _dependent_pairs(sched: Schedule, rank: int) -> list[tuple[int, int]]:
    """Positions ``(i, j)``, ``i < j``, on ``rank`` where action ``j`` waits for action ``i``."""
    acts = sched.rank_actions[rank]
    where = {dep_key(a): pos for pos, a in enumerate(acts)}
    return [(where[key], j) for j, a in enumerate(acts)
            for key in dependencies(a, sched.num_stages) if key in where]  # fmt: skip


@given(valid_schedules())
def test_the_registry_schedules_drawn_are_valid(sched: Schedule) -> None:
    validate(sched)  # so that what the mutations below break is theirs


@given(valid_schedules(), st.data())
def test_dropping_any_action_is_refused(sched: Schedule, data: st.DataObject) -> None:
    rank = data.draw(st.integers(0, sched.num_ranks - 1))
    acts = list(sched.rank_actions[rank])
    pos = data.draw(st.integers(0, len(acts) - 1))
    dropped = acts.pop(pos)
    named = f"stage {dropped.stage} microbatch {dropped.microbatch}"
    with pytest.raises(ScheduleError, match=named):
        validate(_with_rank(sched, rank, acts))


@given(valid_schedules(), st.data())
def test_duplicating_any_action_is_refused(sched: Schedule, data: st.DataObject) -> None:
    rank = data.draw(st.integers(0, sched.num_ranks - 1))
    acts = list(sched.rank_actions[rank])
    copied = acts[data.draw(st.integers(0, len(acts) - 1))]
    acts.insert(data.draw(st.integers(0, len(acts))), copied)
    with pytest.raises(ScheduleError, match=f"action {copied} appears 2 times"):
        validate(_with_rank(sched, rank, acts))


@given(valid_schedules(), st.data())
def test_swapping_an_action_with_one_it_waits_for_deadlocks(
    sched: Schedule, data: st.DataObject
) -> None:
    rank = data.draw(st.integers(0, sched.num_ranks - 1))
    pairs = _dependent_pairs(sched, rank)
    assert pairs, "every rank runs an F and the backward that waits for it"
    i, j = data.draw(st.sampled_from(pairs))
    acts = list(sched.rank_actions[rank])
    waiting = acts[j]
    acts[i], acts[j] = acts[j], acts[i]
    with pytest.raises(ScheduleError, match=f"deadlocks: .*rank {rank}: {waiting} waits for"):
        validate(_with_rank(sched, rank, acts))
