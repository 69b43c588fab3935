"""The one loop of a rank's step: poll, choose the next op, run it; static or handshake.

Static dispatch is this loop with a fixed order: the choice is always the head of the rank's
row, run when its input is here (:func:`dispatch_loop` with ``fixed=True``). The handshake
(``PipelineRunner(dispatch="handshake")``) chooses at run time. Its rule is the
simulator's, one pure function both call
(:func:`nobubble.pipeline.dispatch.handshake.choose_op`); the simulator also asks whether a
deviation is expected to end before the head's input comes, while the runtime has no
duration estimates, so it takes the simple form. Each time the rank is free:

1. the **head** of its plan (its first plan op not run), when it is runnable;
2. else the first runnable **B** (or fused BW) further along the plan (its gradient came
   early: it feeds the previous rank);
3. else the plan's **next F**, when it is runnable and fits the memory limit;
4. else the first runnable **W** further along the plan (W fills the waits);
5. else wait (polling) until the next tensor arrives.

*Runnable*: the op's dependencies on this rank ran (a W its B, a B its F, the F after a V
schedule's turn the F before it) and the tensor it needs from another rank is in the
mailbox (:class:`~.channel.Channel`); an F must also fit the limit.

*Memory*, in microbatch units, kept simple: an F holds one unit until its microbatch's W
(or BW) ends, B frees nothing; the level is F's run minus W's and BW's run. The limit is the
plan's own peak of that level on this rank (:func:`plan_levels`) unless given higher; F is
the only op that raises the level and the rule checks it, so the level never passes it.

*Deadlock freedom* (a valid plan, the limit at least the plan's peak). Order all ops as a
valid run of the plan does (a topological order that respects every rank's plan order) and
let x be the first op in it not run yet, on rank r. Everything before x ran, so x's inputs
were sent, and they arrive: r keeps one header receive posted for every neighbour that
still owes it a message, whatever the order (:mod:`.channel`), and a waiting rank polls.
Every op before x in r's plan ran too, so x is r's head. If x is an F it fits: a deviation F
is always the plan's next F, so every F that r ran precedes x in its plan, while every W and
BW before x ran as well; r's level is at most the plan's level just before x, within the
plan's peak. So rule 1 runs x as soon as r is free, and a busy rank ends its op: some op
always runs, so every op runs. The order each rank ran is a valid schedule (every op ran
after its dependencies, by construction); the tests check it with
:func:`~nobubble.pipeline.validate.validate`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Protocol

from nobubble.pipeline.actions import Action, Op, Schedule
from nobubble.pipeline.dispatch.handshake import PlanRow
from nobubble.pipeline.runtime.channel import MessageKey, incoming
from nobubble.pipeline.validate import dep_key, dependencies

__all__ = ["PlanCursor", "plan_levels", "dispatch_loop", "memory_units"]

HasMessage = Callable[[MessageKey, int], bool]


def memory_units(op: Op) -> int:
    """The change of the level (microbatches held for backward) when ``op`` runs."""
    return 1 if op is Op.F else -1 if op in (Op.W, Op.BW) else 0


def plan_levels(plan: Schedule) -> tuple[int, ...]:
    """Each rank's peak level (microbatches held) when it walks ``plan`` in order."""
    peaks = []
    for acts in plan.rank_actions:
        level = peak = 0
        for a in acts:
            level += memory_units(a.op)
            peak = max(peak, level)
        peaks.append(peak)
    return tuple(peaks)


class PlanCursor:
    """Rank ``rank``'s progress through its row of ``plan`` (module docstring).

    Lifecycle of a plan op: *planned* -> *runnable* (dependencies ran, tensor arrived,
    memory fits) -> *run* (:meth:`commit`). Invariant: ``level <= limit`` after every commit.
    ``fixed``: only the head is ever chosen (static dispatch: the row's own order).
    """

    def __init__(
        self, plan: Schedule, rank: int, limit: int | None = None, *, fixed: bool = False
    ) -> None:
        self.plan, self.rank, self.fixed = plan, rank, fixed
        self.row = plan.rank_actions[rank]
        self.progress = PlanRow([a.op for a in self.row])
        peak = plan_levels(plan)[rank]
        if limit is not None and limit < peak:
            raise ValueError(
                f"memory limit {limit} microbatches on rank {rank} is below the peak {peak} of "
                f"the plan {plan.name!r} there; give at least its peak"
            )
        self.limit = peak if limit is None else limit
        self.ran: set[tuple[int, int, int]] = set()
        self.level = 0

    def runnable(self, k: int, has: HasMessage) -> bool:
        a, plan = self.row[k], self.plan
        for dep in dependencies(a, plan.num_stages):
            if plan.rank_of(dep[1]) == self.rank and dep not in self.ran:
                return False
        need = incoming(plan, a)
        if need is not None and need[1] != self.rank and not has(*need):
            return False
        return a.op is not Op.F or self.level + 1 <= self.limit

    def choose(self, has: HasMessage) -> int | None:
        """The plan position to run now, or None (wait for an arrival): the handshake rule,
        :func:`~nobubble.pipeline.dispatch.handshake.choose_op`, without estimates; with
        ``fixed`` the head or None."""
        head = self.progress.head
        if self.fixed:
            return head if self.runnable(head, has) else None
        return self.progress.choose(lambda j: self.runnable(j, has))

    def commit(self, k: int) -> Action:
        """Mark plan position ``k`` as run; returns its action."""
        a = self.row[k]
        self.progress.mark(k)
        self.ran.add(dep_key(a))
        self.level += memory_units(a.op)
        assert self.level <= self.limit, (a, self.level, self.limit)
        return a


class _Channel(Protocol):  # the part of Channel the loop uses
    def poll(self) -> bool: ...

    def wait(self) -> None: ...

    def has(self, key: MessageKey, src: int) -> bool: ...


def dispatch_loop(
    plan: Schedule,
    rank: int,
    channel: _Channel,
    perform: Callable[[Action, float], None],
    *,
    fixed: bool = False,
    limit: int | None = None,
) -> tuple[list[Action], int]:
    """One step of rank ``rank``: poll, choose, run, until its row of the plan is done
    (``fixed``: in the row's order). ``perform(action, free_since)`` receives (from the
    mailbox), runs and sends one op; ``free_since`` is when the rank became free (its wait
    began). Returns the order run and how many ops ran as deviations."""
    cursor = PlanCursor(plan, rank, limit, fixed=fixed)
    order: list[Action] = []
    free_since = time.perf_counter()
    while not cursor.progress.finished:
        channel.poll()
        k = cursor.choose(channel.has)
        if k is None:
            channel.wait()
            continue
        action = cursor.commit(k)
        perform(action, free_since)
        order.append(action)
        free_since = time.perf_counter()
    return order, cursor.progress.deviations
