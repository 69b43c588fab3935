"""The one loop of a rank's step: poll, choose the next op, run it; static or handshake.

Static dispatch (:func:`dispatch_loop` with ``fixed=True``) always chooses the head of the
rank's row, run when its input is here. The handshake chooses at run time by the
simulator's rule in its simple form (no duration estimates:
:func:`nobubble.pipeline.dispatch.handshake.choose_op`): the head when runnable, else the
first runnable B (or BW) further along the plan, else the plan's next F if it fits, else the
first runnable W, else wait until the next tensor arrives. *Runnable*: its dependencies on
this rank ran and the tensor it needs is in the :class:`~.channel.Channel` mailbox.
*Memory* in microbatch units: an F holds one unit until its microbatch's W (or BW) ends; the
limit is the plan's own peak on this rank (:func:`plan_levels`) unless given higher, so the
level never passes it. With a valid plan the loop cannot deadlock and the order each rank
ran is a valid schedule (the argument: docs/pipeline/handshake.md).
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
