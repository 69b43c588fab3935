"""The ``handshake`` dispatch policy: each rank picks its next op at run time from what has
arrived, guided by a plan, under a per-rank activation-memory limit.

Each time a rank is free it runs (1) its plan's head when runnable, else (2) a deviation: a
runnable op at most ``window`` past the head that is expected to end before the head's input
arrives, B first, then the plan's next F if it fits, then W (a bottleneck rank, slower than
both neighbours by ``bottleneck_margin``, takes any runnable deviation), else (3) waits for
the next announcement or arrival. A committed op is announced with its expected end
(``eta = commit + estimated duration + t_comm``, the duration scaled by the rank's running
slowdown, ``profile_weight``). With every limit at least the plan's own per-rank peak and a
valid plan, no run deadlocks and no rank passes its limit; with exact estimates every op
ends no later than in the static run (the argument: docs/pipeline/handshake.md).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from nobubble.pipeline.actions import Action, Op, Schedule
from nobubble.pipeline.costs import CostModel
from nobubble.pipeline.simulate import plan_peaks
from nobubble.pipeline.validate import dep_key, dependencies
from nobubble.validation import finite

__all__ = ["HandshakeRule", "HandshakeRun", "run_handshake", "plan_peaks", "choose_op", "PlanRow"]

_EPS = 1e-9  # relative slack of time and memory comparisons (sums of floats)
_PRIORITY = {Op.B: 0, Op.BW: 0, Op.F: 1, Op.W: 2}  # deviations: B first, then F, then W


def choose_op(
    ops: Sequence[Op],
    head: int,
    next_f: int,
    done: Sequence[bool],
    runnable: Callable[[int], bool],
    *,
    window: int | None = None,
    in_time: Callable[[int], bool] | None = None,
) -> int | None:
    """The rule (module docstring), one free rank's choice: the plan position it starts
    now, or None (wait). The simulator and the runtime
    (:mod:`nobubble.pipeline.runtime.cursor`) both call it.

    Args:
        ops: the rank's plan, the op of each position.
        head: the first position not run; ``next_f``: the first F not run (``len(ops)``
            when none is left); ``done[j]``: position j ran.
        runnable: whether position j may start now (its dependencies ran, its input
            arrived, it fits the memory limit).
        window: how many positions past the head a deviation may come from (None: all).
        in_time: whether a deviation at position j is expected to end before the head's
            input comes, or the rank may overrun it (None: always; the runtime has no
            duration estimates). Asked only after the head proved not runnable.
    """
    if runnable(head):
        return head
    stop = len(ops) if window is None else min(len(ops), head + 1 + window)
    best, best_rank = None, len(_PRIORITY)
    for j in range(head + 1, stop):
        op = ops[j]
        if done[j] or (op is Op.F and j != next_f):
            continue
        rank = _PRIORITY[op]
        if rank < best_rank and runnable(j) and (in_time is None or in_time(j)):
            best, best_rank = j, rank
            if rank == 0:
                break
    return best


class PlanRow:
    """One rank's progress through its plan row, the state :func:`choose_op` reads: which
    positions ran (``done``), the ``head`` (the first not run), ``next_f`` (the first F not
    run) and how many ran as ``deviations`` (not at the head). The simulator's ranks and the
    runtime's :class:`~nobubble.pipeline.runtime.cursor.PlanCursor` each keep one."""

    def __init__(self, ops: Sequence[Op]) -> None:
        self.ops = list(ops)
        self.done = [False] * len(self.ops)
        self.head = self.deviations = 0
        self.next_f = self._first_f(0)

    @property
    def finished(self) -> bool:
        return self.head == len(self.ops)

    def _first_f(self, k: int) -> int:
        while k < len(self.ops) and (self.done[k] or self.ops[k] is not Op.F):
            k += 1
        return k

    def choose(
        self, runnable: Callable[[int], bool], *, window: int | None = None,
        in_time: Callable[[int], bool] | None = None,
    ) -> int | None:  # fmt: skip
        """:func:`choose_op` on this row."""
        return choose_op(self.ops, self.head, self.next_f, self.done, runnable, window=window,
                         in_time=in_time)  # fmt: skip

    def mark(self, k: int) -> None:
        """Position ``k`` ran."""
        assert not self.done[k], k
        self.deviations += k != self.head
        self.done[k] = True
        while self.head < len(self.ops) and self.done[self.head]:
            self.head += 1
        if k == self.next_f:
            self.next_f = self._first_f(k + 1)


@dataclass(frozen=True, slots=True, kw_only=True)
class HandshakeRule:
    """The switches of the rule (module docstring)."""

    window: int = 64
    """How many plan ops past its head a rank looks for a deviation (0: the static order)."""
    profile_weight: float = 0.25
    """Weight of a rank's newest op in its running slowdown estimate (0: trust nominal)."""
    bottleneck_margin: float | None = 0.2
    """A rank whose slowdown passes both neighbours' by this fraction is the bottleneck: it
    takes any runnable deviation, even one that overruns its head's eta (None: never)."""

    def __post_init__(self) -> None:
        if not (isinstance(self.window, int) and self.window >= 0):
            raise ValueError(f"HandshakeRule.window={self.window!r} must be an integer >= 0")
        if not 0 <= self.profile_weight <= 1:
            raise ValueError(
                f"HandshakeRule.profile_weight={self.profile_weight!r} must be in [0, 1]"
            )
        margin = self.bottleneck_margin
        if margin is not None and not (finite(margin) and margin >= 0):
            raise ValueError(f"HandshakeRule.bottleneck_margin={margin!r} must be >= 0 or None")


@dataclass(frozen=True, slots=True)
class HandshakeRun:
    """What the handshake ran: the per-rank order (a valid schedule named
    ``"<plan>+handshake"`` that a static run replays), the times of its actions
    (``start[r][k]`` for ``schedule.rank_actions[r][k]``) and how many ops ran as
    deviations (before an earlier op of their rank's plan)."""

    schedule: Schedule
    start: tuple[tuple[float, ...], ...]
    end: tuple[tuple[float, ...], ...]
    deviations: int


@dataclass(frozen=True, slots=True)
class _PlannedOp:
    """One plan entry, precomputed: its dependencies as ``(slot, crosses ranks, producer's
    nominal duration)``, its own slot, its nominal duration and its memory change."""

    action: Action
    deps: tuple[tuple[int, bool, float], ...]
    slot: int
    nominal: float
    memory: float


def _plan_ops(plan: Schedule, costs: CostModel) -> list[list[_PlannedOp]]:
    """Every rank's plan as :class:`_PlannedOp` (``costs`` one entry per stage)."""
    num_stages, m, owner = plan.num_stages, plan.num_microbatches, plan.stage_to_rank

    def slot(key: tuple[int, int, int]) -> int:  # (kind, stage, microbatch) -> flat index
        return (key[0] * num_stages + key[1]) * m + key[2]

    producer = {slot(dep_key(a)): costs.duration(a) for _, _, a in plan.actions()}

    def planned(r: int, a: Action) -> _PlannedOp:
        deps = tuple(
            (slot(d), owner[d[1]] != r, producer[slot(d)]) for d in dependencies(a, num_stages)
        )
        return _PlannedOp(a, deps, slot(dep_key(a)), costs.duration(a), costs.memory_delta(a))

    return [[planned(r, a) for a in acts] for r, acts in enumerate(plan.rank_actions)]


class _Pipeline:
    """Every rank's progress through its plan while the handshake runs.

    Lifecycle of an op: *planned* -> *runnable* (inputs arrived, memory fits) -> *running*
    (committed: the neighbours were told its eta) -> *done* (its output is on the way).
    Invariant: ``level[r] <= limits[r]`` after every commit.
    """

    def __init__(
        self, plan: Schedule, costs: CostModel, limits: Sequence[float],
        duration: Callable[[Action], float], rule: HandshakeRule,
    ) -> None:  # fmt: skip
        p = plan.num_ranks
        self.ops = _plan_ops(plan, costs)
        self.rows = [PlanRow([op.action.op for op in row]) for row in self.ops]
        self.t_comm, self.limits, self.duration, self.rule = costs.t_comm, limits, duration, rule
        num_slots = 3 * plan.num_stages * plan.num_microbatches
        self.end_at: list[float | None] = [None] * num_slots  # real end, known at commit
        self.eta_at: list[float | None] = [None] * num_slots  # end as announced
        self.consumers: list[set[int]] = [set() for _ in range(num_slots)]
        for r, row in enumerate(self.ops):
            for op in row:
                for dep, crosses, _ in op.deps:
                    if crosses:
                        self.consumers[dep].add(r)
        self.level, self.free_at, self.slowdown = [0.0] * p, [0.0] * p, [1.0] * p
        self.last: list[_PlannedOp | None] = [None] * p
        self.order: list[list[Action]] = [[] for _ in range(p)]
        self.start: list[list[float]] = [[] for _ in range(p)]
        self.end: list[list[float]] = [[] for _ in range(p)]
        self.events: list[tuple[float, int, int]] = []  # (time, sequence, rank) wake-ups
        self._seq = 0

    def wake(self, rank: int, t: float) -> None:
        heapq.heappush(self.events, (t, self._seq, rank))
        self._seq += 1

    def runnable(self, r: int, op: _PlannedOp, t: float) -> bool:
        for dep, crosses, _ in op.deps:
            end = self.end_at[dep]
            if end is None or (end + self.t_comm if crosses else end) > t:
                return False
        return op.memory <= 0 or self.level[r] + op.memory <= self.limits[r] * (1 + _EPS)

    def input_eta(self, op: _PlannedOp, t: float) -> float | None:
        """When the last missing input of ``op`` is expected (None: none is missing):
        as announced, or, when its producer has not started, one producer duration from
        now at the earliest. An overdue announcement counts as due now."""
        eta = None
        for dep, crosses, producer in op.deps:
            comm = self.t_comm if crosses else 0.0
            end, announced = self.end_at[dep], self.eta_at[dep]
            if end is None or announced is None:
                due = t + producer + comm
            elif end + comm > t:
                due = max(t, announced + comm)
            else:
                continue  # arrived
            eta = due if eta is None else max(eta, due)
        return eta

    def is_bottleneck(self, r: int) -> bool:
        """Whether rank r runs slower than both neighbours (by the rule's margin); each
        announcement carries its sender's slowdown, so this is what r knows."""
        margin = self.rule.bottleneck_margin
        near = [self.slowdown[q] for q in (r - 1, r + 1) if 0 <= q < len(self.ops)]
        return margin is not None and bool(near) and self.slowdown[r] > max(near) * (1 + margin)

    def choose(self, r: int, t: float) -> int | None:
        """The rule (:func:`choose_op`): the plan position rank r starts now, or None."""
        row, k = self.ops[r], self.rows[r].head
        deadline: list[float] = []  # the head's input eta, found once it is not runnable

        def in_time(j: int) -> bool:
            if not deadline:
                eta = self.input_eta(row[k], t)
                assert eta is not None, (
                    f"rank {r}: head {row[k].action} has its inputs but no memory"
                )
                deadline.append(math.inf if self.is_bottleneck(r) else eta * (1 + _EPS))
            return t + row[j].nominal * self.slowdown[r] <= deadline[0]

        return self.rows[r].choose(lambda j: self.runnable(r, row[j], t),
                                   window=self.rule.window, in_time=in_time)  # fmt: skip

    def commit(self, r: int, k: int, t: float) -> None:
        """Start plan position k on rank r at time t; announce it to its consumers."""
        op = self.ops[r][k]
        self.rows[r].mark(k)
        previous = self.last[r]
        if previous is not None:  # it has ended (r is free): fold it into the estimate
            took = self.end[r][-1] - self.start[r][-1]
            w = self.rule.profile_weight
            self.slowdown[r] = (1 - w) * self.slowdown[r] + w * took / previous.nominal
        self.last[r] = op
        end = self.free_at[r] = t + self.duration(op.action)
        self.end_at[op.slot], self.eta_at[op.slot] = end, t + op.nominal * self.slowdown[r]
        self.level[r] += op.memory
        assert self.level[r] <= self.limits[r] * (1 + _EPS), (op.action, self.level[r])
        self.order[r].append(op.action)
        self.start[r].append(t)
        self.end[r].append(end)
        self.wake(r, end)
        for consumer in self.consumers[op.slot]:
            self.wake(consumer, t)  # the announcement: guards may relax
            self.wake(consumer, end + self.t_comm)  # the arrival

    def run(self) -> None:
        for r in range(len(self.ops)):
            self.wake(r, 0.0)
        while self.events:
            t, _, r = heapq.heappop(self.events)
            if self.free_at[r] > t or self.rows[r].finished:
                continue  # busy (it wakes when its op ends), or finished
            k = self.choose(r, t)
            if k is not None:
                self.commit(r, k, t)
        stuck = {r: str(self.ops[r][row.head].action) for r, row in enumerate(self.rows)
                 if not row.finished}  # fmt: skip
        assert not stuck, f"handshake stuck at heads {stuck} (limits below the plan's peak?)"


def run_handshake(
    plan: Schedule,
    costs: CostModel,
    *,
    limits: Sequence[float],
    duration: Callable[[Action], float],
    rule: HandshakeRule = HandshakeRule(),
) -> HandshakeRun:
    """Run the handshake on ``plan`` with per-rank activation-memory ``limits``.

    Args:
        plan: a valid schedule (any shape: chunks, fused backward); its order guides.
        costs: nominal costs, one entry per stage of ``plan``; estimates use them.
        limits: memory allowed per rank (``len == num_ranks``), each at least the plan's
            peak on that rank (:func:`plan_peaks`).
        duration: the real time of each action (nominal or perturbed).
    Returns the :class:`HandshakeRun`. Raises ValueError when a limit is below the plan's
    peak (the deadlock-freedom argument needs it).
    """
    peaks = plan_peaks(plan, costs)
    if len(limits) != plan.num_ranks:
        raise ValueError(f"limits has {len(limits)} entries; give one per rank ({plan.num_ranks})")
    for r, (limit, peak) in enumerate(zip(limits, peaks)):
        if limit < peak * (1 - _EPS):
            raise ValueError(
                f"memory limit {limit:g} on rank {r} is below the peak {peak:g} of the plan "
                f"{plan.name!r} there; give at least its peak, or a plan built for the limit "
                "(zb-1p / zb-2p with mem_limit)"
            )
    state = _Pipeline(plan, costs, limits, duration, rule)
    state.run()
    rows = tuple(map(tuple, state.order))
    executed = Schedule(f"{plan.name}+handshake", plan.num_microbatches, plan.stage_to_rank, rows)
    times = (tuple(map(tuple, state.start)), tuple(map(tuple, state.end)))
    return HandshakeRun(executed, *times, deviations=sum(row.deviations for row in state.rows))
