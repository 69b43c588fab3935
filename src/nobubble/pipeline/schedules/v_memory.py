"""V-Min, V-Half, V-ZB: V schedules whose activation memory is chosen up front.

After Qi et al. 2024, "Pipeline Parallelism with Controllable Memory". Two chunks per rank
in a V, as ZB-V (:mod:`nobubble.pipeline.schedules.v_shape`): rank r holds stage r (chunk 0,
``down``) and stage 2p-1-r (chunk 1, ``up``).

**Building block.** One microbatch's ops on every rank, laid out in unit time slots: on rank
r, forward of the down chunk at slot ``f0[r]``, forward of the up chunk at ``f1[r]``, input
gradient of the up chunk at ``b1[r]`` (the gradient turns around on rank 0, so B runs up the
ranks first), input gradient of the down chunk at ``b0[r]``; the two Ws go into the first
free slots after their B. Microbatch i is the block shifted by ``6 i`` slots (each rank runs
six ops per microbatch), so a rank holds a microbatch's activations for its *lifespan*
(F to W) and its peak is about ``(sum of lifespans) / 6`` chunk activations: the offsets set
the memory. Per rank r (``g`` keeps the four slots distinct modulo 6):

| schedule | f0 | f1 | b1 | b0 | lifespans (sum) | peak, rank units |
|---|---|---|---|---|---|---|
| V-Min | r | 2p-1-r | 2p+g+r | 4p+g-1-r | ~ 4p | about (p+4)/3 |
| V-Half | 2r | 3p-2-r | 3p-1+g+2r | 6p-2+g-r | ~ 6p | about (p+2)/2 |
| V-ZB | r | 2p-1-r | 2p+D+r | 4p+D-1-r | ~ 12p | at most p (1F1B's) |

V-Min: ``g = 2`` when 3 divides p, else 0; V-Half: ``g = 3`` when p is even, else 0 (the
paper's offsets). V-ZB stretches V-Min's B side by the largest even ``D`` whose block still
holds at most 2p chunk activations: the same shape at 1F1B's memory.

**Unit.** A *rank unit* is one microbatch's activations on one rank: ``mem_f`` of its two
chunks together (each chunk stores half of what the rank's layers store).

**Compaction.** The repeated block is valid for any m (every dependency sits in an earlier
slot), but with real costs (T_F != T_B != T_W, T_comm > 0) and in warm-up / cool-down it
leaves gaps. :func:`v_memory_schedule` then list-schedules the same ops with the given
costs: each rank, when free, runs the ready op (inputs arrived) of the earliest block slot,
fills waits with pending Ws, and never stores more than the block's own peak (measured with
these costs). A forward of the down chunk starts only if the rank still has room for the up
chunk of every microbatch it has started (a started microbatch can always finish its
forward). Three variants (block priority; B first; or backfilling only what ends before the
next block op's input arrives) and the plain block are simulated, a variant that gets stuck
is dropped, and the shortest longest-rank span wins: compaction never does worse than the
block. (The simulator runs the plain block eagerly, which is already the paper's
"squeeze"; on the paper's costs the list scheduler wins for V-ZB, V-Min and V-Half keep
the block's order.)

Limits: ``num_ranks >= 1``, ``num_microbatches >= 1`` (below about 2p microbatches the block
is cut short and warm-up dominates).
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from nobubble.pipeline.actions import Action, Op, Schedule
from nobubble.pipeline.costs import CostModel
from nobubble.pipeline.schedules.v_shape import v_stage_to_rank
from nobubble.pipeline.simulate import simulate
from nobubble.pipeline.validate import DepKey, dep_key, dependencies, validate
from nobubble.validation import check_value

__all__ = [
    "V_MEMORY_NAMES",
    "MEMORY_BOUND",
    "BuildingBlock",
    "building_block",
    "block_schedule",
    "v_memory_schedule",
]

V_MEMORY_NAMES = ("v-min", "v-half", "v-zb")
PERIOD = 6  # slots per microbatch on each rank: F, F, B, B, W, W (two chunks)

MEMORY_BOUND = {
    "v-min": lambda p: (p + 4) / 3,
    "v-half": lambda p: (p + 2) / 2,
    "v-zb": lambda p: float(p),
}
"""Peak activation memory per rank, in rank units, that each schedule stays within."""


@dataclass(frozen=True, slots=True)
class BuildingBlock:
    """One microbatch's slots on every rank (see the module docstring).

    Attributes:
        name: ``"v-min"``, ``"v-half"`` or ``"v-zb"``.
        slots: ``slots[r] = (f0, f1, b1, b0)``, rank r's slots for microbatch 0; microbatch i
            runs each at ``slot + 6 i``.
    """

    name: str
    slots: tuple[tuple[int, int, int, int], ...]

    @property
    def num_ranks(self) -> int:
        return len(self.slots)


def _offsets(name: str, p: int, gap: int) -> tuple[tuple[int, int, int, int], ...]:
    if name == "v-half":
        return tuple((2 * r, 3 * p - 2 - r, 3 * p - 1 + gap + 2 * r, 6 * p - 2 + gap - r)
                     for r in range(p))  # fmt: skip
    return tuple((r, 2 * p - 1 - r, 2 * p + gap + r, 4 * p + gap - 1 - r) for r in range(p))


def building_block(name: str, num_ranks: int) -> BuildingBlock:
    """The building block of ``name`` (one of :data:`V_MEMORY_NAMES`) for p ranks."""
    check_value("num_ranks", num_ranks, ">= 1", integer=True)
    p = num_ranks
    if name == "v-min":
        return BuildingBlock(name, _offsets(name, p, 2 if p % 3 == 0 else 0))
    if name == "v-half":
        return BuildingBlock(name, _offsets(name, p, 3 if p % 2 == 0 else 0))
    if name != "v-zb":
        raise ValueError(f"unknown V schedule {name!r}; choose one of {', '.join(V_MEMORY_NAMES)}")
    # the largest stretch D (even, 2p + D not a multiple of 6) at <= 2p chunk activations
    best = 2 if p % 3 == 0 else 0
    for stretch in range(best, 12 * p + 1, 2):
        if (2 * p + stretch) % PERIOD and _in_flight_peak(_offsets(name, p, stretch)) <= 2 * p:
            best = stretch
    return BuildingBlock(name, _offsets(name, p, best))


def _block_rank_order(slots: tuple[int, int, int, int], r: int, p: int, m: int) -> list[Action]:
    """Rank r's ops of m repeated blocks in slot order, each W in the first free slot after
    its B (Ws in the order of their Bs)."""
    down, up = r, 2 * p - 1 - r
    timed: dict[int, Action] = {}
    for i in range(m):
        for slot, action in zip(slots, (Action(down, Op.F, i), Action(up, Op.F, i),
                                        Action(up, Op.B, i), Action(down, Op.B, i))):  # fmt: skip
            assert slot + PERIOD * i not in timed, "block slots collide modulo 6"
            timed[slot + PERIOD * i] = action
    order: list[Action] = []
    pending: list[Action] = []
    t, last = 0, max(timed)
    while t <= last or pending:
        at_slot = timed.get(t)
        if at_slot is not None:
            order.append(at_slot)
            if at_slot.op is Op.B:
                pending.append(Action(at_slot.stage, Op.W, at_slot.microbatch))
        elif pending:
            order.append(pending.pop(0))
        t += 1
    return order


def _in_flight_peak(slots: Sequence[tuple[int, int, int, int]]) -> int:
    """Largest number of chunk activations a rank holds (stored at F, freed at W) over a
    long run of blocks (m = 3p + 6 reaches the steady state)."""
    p = len(slots)
    peak = 0
    for r in range(p):
        level = 0
        for a in _block_rank_order(slots[r], r, p, 3 * p + 6):
            level += 1 if a.op is Op.F else (-1 if a.op is Op.W else 0)
            peak = max(peak, level)
    return peak


def block_schedule(block: BuildingBlock, num_microbatches: int) -> Schedule:
    """The building block repeated for m microbatches, uncompacted (valid for any m)."""
    check_value("num_microbatches", num_microbatches, ">= 1", integer=True)
    p = block.num_ranks
    rows = tuple(tuple(_block_rank_order(block.slots[r], r, p, num_microbatches)) for r in range(p))
    return Schedule(block.name, num_microbatches, v_stage_to_rank(p), rows)


@dataclass(frozen=True, slots=True)
class _Variant:
    """Switches of the list scheduler (see :func:`_compact` and :func:`_choose`)."""

    pick: str  # "slot": the ready op of the earliest slot; "b-first": a ready B first;
    # "backfill": the earliest-slot op, else only what ends before its input arrives
    w_when_idle: bool  # fill any wait with a pending W (else only one that fits the wait)


# the three that won somewhere on the paper's configurations (of the six combinations)
_VARIANTS = (_Variant("slot", False), _Variant("b-first", True), _Variant("backfill", False))
_EPS = 1e-9


def v_memory_schedule(
    name: str, num_ranks: int, num_microbatches: int, *, costs: CostModel | None = None
) -> Schedule:
    """V-Min / V-Half / V-ZB for p ranks (2p stages in a V) and m microbatches.

    Args:
        name: ``"v-min"``, ``"v-half"`` or ``"v-zb"``.
        num_ranks: p >= 1. num_microbatches: m >= 1.
        costs: per rank (p entries) or per stage (2p); default uniform F = B = W = 1,
            T_comm = 0, memory split evenly between B and W. The compaction is tuned to
            them; the order is valid under any costs.

    Returns the compacted schedule (module docstring), whose peak activation memory per
    rank is at most the uncompacted block's under ``costs``, which is within
    :data:`MEMORY_BOUND` rank units.
    """
    block = building_block(name, num_ranks)
    plain = block_schedule(block, num_microbatches)
    p = num_ranks
    if costs is None:
        costs = CostModel.uniform(p)
    if costs.num_stages not in (p, 2 * p):
        raise ValueError(f"costs have {costs.num_stages} stages; give one per rank ({p}) "
                         f"or one per stage ({2 * p}) for {name}")  # fmt: skip
    costs = costs.for_stages(plain.stage_to_rank)
    base = simulate(plain, costs)
    cap = max(base.peak_memory)
    best, best_span = plain, base.max_span
    for variant in _VARIANTS:
        candidate = _compact(plain, costs, cap, variant)
        if candidate is None:
            continue
        result = simulate(candidate, costs)
        if max(result.peak_memory) <= cap * (1 + 1e-9) and result.max_span < best_span - 1e-9:
            best, best_span = candidate, result.max_span
    validate(best)
    return best


class _RankState:
    """One rank's queues while the list scheduler runs: its F and B ops by chunk, each in
    block order; its pending Ws (in the order of their Bs); memory and clock."""

    def __init__(self, rank: int, block_order: Sequence[Action]):
        self.rank = rank
        self.slot_of = {a: k for k, a in enumerate(block_order)}  # block order = slot order
        self.queues = [
            [a for a in block_order if a.op is op and a.stage == stage]
            for op in (Op.F, Op.B)
            for stage in sorted({a.stage for a in block_order})
        ]
        self.heads_at = [0] * len(self.queues)
        self.pending_w: deque[Action] = deque()
        self.order: list[Action] = []
        self.clock = 0.0
        self.memory = 0.0
        self.started_down = 0  # microbatches whose down-chunk F ran here
        self.started_up = 0

    def heads(self) -> list[tuple[int, Action]]:
        return [(k, q[self.heads_at[k]]) for k, q in enumerate(self.queues)
                if self.heads_at[k] < len(q)]  # fmt: skip

    def done(self) -> bool:
        return not self.pending_w and all(h == len(q) for h, q in zip(self.heads_at, self.queues))


def _compact(plain: Schedule, costs: CostModel, cap: float, variant: _Variant) -> Schedule | None:
    """List-schedule ``plain``'s ops under ``costs``; None if the scheduler gets stuck.

    Each rank, at its decision time, runs the F/B of the earliest block slot if its inputs
    are there (and, for an F, memory allows: :func:`_fits`); otherwise it *backfills*: a
    ready op of a later slot, or a pending W, that ends before that op's input arrives. The
    ranks decide in time order (a heap), so every input that exists by a rank's decision
    time is known to it; a rank with nothing to do sleeps until an input it waits for is
    computed.
    """
    num_stages, owner = plain.num_stages, plain.stage_to_rank
    states = [_RankState(r, acts) for r, acts in enumerate(plain.rank_actions)]
    end: dict[DepKey, float] = {}
    waiting: dict[DepKey, list[int]] = {}
    version = [0] * plain.num_ranks
    heap = [(0.0, 0, r) for r in range(plain.num_ranks)]

    def arrival(a: Action, rank: int) -> tuple[float | None, DepKey | None]:
        t = 0.0
        for dep in dependencies(a, num_stages):
            done = end.get(dep)
            if done is None:
                return None, dep
            t = max(t, done + (costs.t_comm if owner[dep[1]] != rank else 0.0))
        return t, None

    def wake(rank: int, at: float) -> None:
        version[rank] += 1
        heapq.heappush(heap, (at, version[rank], rank))

    while heap:
        at, ver, r = heapq.heappop(heap)
        st = states[r]
        if ver != version[r] or st.done():
            continue
        now = max(at, st.clock)
        heads, missing_keys = [], []  # heads: see _choose
        for k, a in st.heads():
            t, missing = arrival(a, r)
            if missing is not None:
                missing_keys.append(missing)
            full = a.op is Op.F and not _fits(st, a, costs, cap)  # only Ws free room here
            heads.append((st.slot_of[a], k, a, t, full))
        choice = _choose(st, heads, now, costs, variant)
        if choice is None:
            times = [t for _, _, _, t, _ in heads if t is not None and t > now + _EPS]
            for missing in missing_keys:
                waiting.setdefault(missing, []).append(r)
            if times:
                st.clock = max(st.clock, min(times))  # idle until then, whatever comes
                wake(r, st.clock)
            continue
        k, a = choice
        produced = _run(st, k, a, now, costs)
        end[dep_key(a)] = st.clock
        for q in waiting.pop(produced, ()):
            wake(q, max(states[q].clock, st.clock))
        wake(r, st.clock)
    if not all(s.done() for s in states):
        return None
    rows = tuple(tuple(s.order) for s in states)
    return Schedule(plain.name, plain.num_microbatches, plain.stage_to_rank, rows)


def _choose(
    st: _RankState, heads: list, now: float, costs: CostModel, variant: _Variant
) -> tuple[int, Action] | None:
    """``(queue index, or -1 for a W; action)`` to run at ``now``, or None to wait.

    ``heads``: ``(slot, queue index, action, arrival or None, blocked by memory)`` of the
    rank's next F/B of each chunk.
    """
    ready = [(slot, k, a) for slot, k, a, t, full in heads
             if t is not None and t <= now + _EPS and not full]  # fmt: skip
    waits = [t for _, _, _, t, _ in heads if t is not None and t > now + _EPS]
    deadline = min(waits, default=float("inf"))
    # a ready F that memory holds back: only this rank's Ws can make room
    blocked = any(full and t is not None and t <= now + _EPS for _, _, _, t, full in heads)
    w = (-1, st.pending_w[0]) if st.pending_w else None
    if variant.pick == "backfill":
        first = min(heads, key=lambda h: h[0], default=None)
        if first is not None and not first[4] and first[3] is not None:
            if first[3] <= now + _EPS:
                return first[1], first[2]
            deadline = first[3]
        fillers = [(k, a) for _, k, a in sorted(ready)] + ([w] if w else [])
        for k, a in fillers:
            if now + costs.duration(a) <= deadline + _EPS or (k < 0 and blocked):
                return k, a
        return None
    if ready:
        b_first = variant.pick == "b-first"
        slot, k, a = min(ready, key=lambda h: (b_first and h[2].op is not Op.B, h[0]))
        return k, a
    if w and (blocked or variant.w_when_idle or now + costs.duration(w[1]) <= deadline + _EPS):
        return w
    return None


def _fits(st: _RankState, f: Action, costs: CostModel, cap: float) -> bool:
    """Room for this forward, and (for the down chunk) for the up chunk of every microbatch
    started here, so a started microbatch can always finish its forward on this rank."""
    down = st.rank
    mem_up = costs.mem_f[costs.num_stages - 1 - down]
    outstanding = st.started_down - st.started_up  # down chunk done, up chunk not yet
    need = costs.mem_f[f.stage] + mem_up * (outstanding + (1 if f.stage == down else -1))
    return st.memory + need <= cap * (1 + _EPS)


def _run(st: _RankState, k: int, a: Action, now: float, costs: CostModel) -> DepKey:
    """Run ``a`` on its rank at ``now``; returns the key it produces."""
    if k < 0:
        st.pending_w.popleft()
    else:
        st.heads_at[k] += 1
    st.clock = now + costs.duration(a)
    st.memory += costs.memory_delta(a)
    st.order.append(a)
    if a.op is Op.B:
        st.pending_w.append(Action(a.stage, Op.W, a.microbatch))
    elif a.op is Op.F and a.stage == st.rank:
        st.started_down += 1
    elif a.op is Op.F:
        st.started_up += 1
    return dep_key(a)
