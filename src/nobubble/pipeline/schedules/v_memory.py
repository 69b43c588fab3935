"""V-Min, V-Half, V-ZB (Qi et al. 2024, "Pipeline Parallelism with Controllable Memory").

V schedules (rank r holds stages r and 2p-1-r) whose activation memory is set by a building
block's slot offsets, per rank r (``g`` keeps the four slots distinct modulo 6):

| schedule | f0 | f1 | b1 | b0 | peak, rank units |
|---|---|---|---|---|---|
| V-Min | r | 2p-1-r | 2p+g+r | 4p+g-1-r | about (p+4)/3 |
| V-Half | 2r | 3p-2-r | 3p-1+g+2r | 6p-2+g-r | about (p+2)/2 |
| V-ZB | 4r | 6p-3-2r | 6p-2+4r | 12p-5-2r | p (1F1B's) |

V-Min: ``g = 2`` when 3 divides p, else 0; V-Half: ``g = 3`` when p is even, else 0. A rank
unit is one microbatch's activations on one rank. The block is repeated, reordered within the
block's memory cap and squeezed by simulation; the shortest candidate within the cap wins
(docs/pipeline/schedules.md, "Controllable memory"). Limits: ``num_ranks >= 1``,
``num_microbatches >= 1``.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from nobubble.pipeline.actions import Action, Op, Schedule
from nobubble.pipeline.costs import CostModel
from nobubble.pipeline.schedules.v_shape import v_stage_to_rank, zb_v
from nobubble.pipeline.simulate import simulate
from nobubble.pipeline.validate import DepKey, dep_key, dependencies, validate
from nobubble.validation import check_value

__all__ = [
    "V_MEMORY_NAMES",
    "MEMORY_BOUND",
    "BuildingBlock",
    "building_block",
    "block_schedule",
    "reordered_schedule",
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

_EPS = 1e-9
Slots = list[dict[Action, int]]  # per rank: action -> its unit time slot


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


def building_block(name: str, num_ranks: int) -> BuildingBlock:
    """The building block of ``name`` (one of :data:`V_MEMORY_NAMES`) for p ranks."""
    check_value("num_ranks", num_ranks, ">= 1", integer=True)
    p = num_ranks
    if name == "v-min":
        g = 2 if p % 3 == 0 else 0
        rows = [(r, 2 * p - 1 - r, 2 * p + g + r, 4 * p + g - 1 - r) for r in range(p)]
    elif name == "v-half":
        g = 3 if p % 2 == 0 else 0
        rows = [(2 * r, 3 * p - 2 - r, 3 * p - 1 + g + 2 * r, 6 * p - 2 + g - r) for r in range(p)]
    elif name == "v-zb":
        rows = [(4 * r, 6 * p - 3 - 2 * r, 6 * p - 2 + 4 * r, 12 * p - 5 - 2 * r) for r in range(p)]
    else:
        raise ValueError(f"unknown V schedule {name!r}; choose one of {', '.join(V_MEMORY_NAMES)}")
    return BuildingBlock(name, tuple(rows))


# -- the repeated block, as slots ----------------------------------------------------------


def _block_slots(block: BuildingBlock, num_microbatches: int) -> Slots:
    """The block repeated for m microbatches: F/B at ``slot + 6 i``, each W in the first free
    slot after its B (Ws in the order of their Bs)."""
    p = block.num_ranks
    out: Slots = []
    for r, (f0, f1, b1, b0) in enumerate(block.slots):
        down, up = r, 2 * p - 1 - r
        timed: dict[Action, int] = {}
        for i in range(num_microbatches):
            shift = PERIOD * i
            timed[Action(down, Op.F, i)] = f0 + shift
            timed[Action(up, Op.F, i)] = f1 + shift
            timed[Action(up, Op.B, i)] = b1 + shift
            timed[Action(down, Op.B, i)] = b0 + shift
        assert len(set(timed.values())) == len(timed), "block slots collide modulo 6"
        out.append(_with_ws(timed))
    return out


def _with_ws(timed: dict[Action, int]) -> dict[Action, int]:
    """F/B slots plus each W in the first free slot after its B, in the order of the Bs."""
    at_slot = {t: a for a, t in timed.items() if a.op is not Op.W}
    out: dict[Action, int] = {}
    pending: deque[Action] = deque()
    t, last = 0, max(at_slot)
    while t <= last or pending:
        a = at_slot.get(t)
        if a is not None:
            out[a] = t
            if a.op is Op.B:
                pending.append(Action(a.stage, Op.W, a.microbatch))
        elif pending:
            out[pending.popleft()] = t
        t += 1
    return out


def _to_schedule(name: str, num_microbatches: int, slots: Slots) -> Schedule:
    rows = tuple(tuple(sorted(rank_slots, key=rank_slots.__getitem__)) for rank_slots in slots)
    return Schedule(name, num_microbatches, v_stage_to_rank(len(slots)), rows)


def block_schedule(block: BuildingBlock, num_microbatches: int) -> Schedule:
    """The building block repeated for m microbatches, uncompacted (valid for any m)."""
    check_value("num_microbatches", num_microbatches, ">= 1", integer=True)
    return _to_schedule(block.name, num_microbatches, _block_slots(block, num_microbatches))


# -- reordering (the paper's step after repeating) -----------------------------------------


def reordered_schedule(
    block: BuildingBlock, num_microbatches: int, costs: CostModel, cap: float, *, passes: int = 2
) -> Schedule:
    """The repeated block with its warm-up and cool-down reordered (module docstring).

    Args:
        costs: per stage (2p entries); only its memory model is used. cap: the peak memory
            per rank the moves may reach (normally the block's own peak under ``costs``).
        passes: 1 (every op of the warm-up and cool-down, Ws included) or 2 (then the
            cool-down's Bs once more, with the Ws placed afresh behind them).
    """
    m = num_microbatches
    slots = _move_earlier(_block_slots(block, m), m, costs, cap, warm_up=True)
    if passes > 1:
        fb = [{a: t for a, t in s.items() if a.op is not Op.W} for s in slots]
        slots = [_with_ws(s) for s in _move_earlier(fb, m, costs, cap, warm_up=False)]
    return _to_schedule(block.name, m, slots)


def _move_earlier(slots: Slots, m: int, costs: CostModel, cap: float, *, warm_up: bool) -> Slots:
    """One reordering pass over ``slots`` (changed in place and returned): ops in slot order;
    a movable one goes to the earliest free slot after its inputs and its predecessor of the
    same kind where the rank's memory stays within ``cap``. ``warm_up=False``: only the
    cool-down's Bs move (no Ws in ``slots``, so only moves that free memory are allowed)."""
    p, num_stages = len(slots), 2 * len(slots)
    owner = v_stage_to_rank(p)
    where = {a: t for rank_slots in slots for a, t in rank_slots.items()}
    warm_up_ends = where[Action(0, Op.B, 0)]
    cool_down_starts = where[Action(0, Op.F, m - 1)]
    horizon = max(where.values()) + 1
    levels = [_levels(rank_slots, costs, horizon) for rank_slots in slots]
    taken: list[set[int]] = [set() for _ in range(p)]
    for t, r, a in sorted((t, owner[a.stage], a) for a, t in where.items()):
        movable = (warm_up and t < warm_up_ends) or t >= cool_down_starts
        if not warm_up:
            movable = movable and a.op is Op.B and costs.memory_delta(a) <= 0
            movable = movable and costs.memory_transient(a) <= 0
        new = t
        if movable:
            earliest = 1 + max((where[Action(s, (Op.F, Op.B, Op.W)[k], i)]
                                for k, s, i in dependencies(a, num_stages)), default=-1)  # fmt: skip
            if a.microbatch > 0:
                earliest = max(earliest, where[Action(a.stage, a.op, a.microbatch - 1)] + 1)
            new = _earliest_slot(a, t, earliest, levels[r], taken[r], costs, cap)
            for u in range(new, t):
                levels[r][u] += costs.memory_delta(a)
        taken[r].add(new)
        where[a] = slots[r][a] = new
    return slots


def _levels(rank_slots: dict[Action, int], costs: CostModel, horizon: int) -> list[float]:
    """Memory held after each slot (``horizon`` slots) of one rank."""
    change = [0.0] * horizon
    for a, t in rank_slots.items():
        change[t] += costs.memory_delta(a)
    level, out = 0.0, []
    for c in change:
        level += c
        out.append(level)
    return out


def _earliest_slot(
    a: Action, t: int, earliest: int, levels: list[float], taken: set[int], costs: CostModel,
    cap: float,
) -> int:  # fmt: skip
    """The earliest free slot in ``[earliest, t)`` from where ``a`` (now at t) keeps the
    rank within ``cap``; t if none. Moving earlier adds ``a``'s memory change to the slots
    it jumps over, so the scan goes backwards and stops at the first slot that overflows."""
    grow = max(costs.memory_delta(a), costs.memory_transient(a), 0.0)
    best, held = t, levels[t - 1] if t > 0 else 0.0
    for u in range(t - 1, max(earliest, 0) - 1, -1):
        held = max(held, levels[u - 1] if u > 0 else 0.0)
        if grow > 0 and held + grow > cap * (1 + _EPS):
            break  # an op that frees memory may always move earlier
        if u not in taken:
            best = u
    return best


# -- the schedule for given costs ----------------------------------------------------------


def v_memory_schedule(
    name: str, num_ranks: int, num_microbatches: int, *, costs: CostModel | None = None
) -> Schedule:
    """V-Min / V-Half / V-ZB for p ranks (2p stages in a V) and m microbatches.

    Args:
        name: ``"v-min"``, ``"v-half"`` or ``"v-zb"``.
        num_ranks: p >= 1. num_microbatches: m >= 1.
        costs: per rank (p entries) or per stage (2p); default uniform F = B = W = 1,
            T_comm = 0, memory split evenly between B and W. The choice among the
            candidates is tuned to them; every candidate is valid under any costs.

    Returns the best candidate under ``costs`` (module docstring), whose peak activation
    memory per rank is at most the block's (for V-ZB: the block's or ZB-V's) under
    ``costs``, which is within :data:`MEMORY_BOUND` rank units.
    """
    block = building_block(name, num_ranks)
    plain = block_schedule(block, num_microbatches)
    p, m = num_ranks, num_microbatches
    if costs is None:
        costs = CostModel.uniform(p)
    if costs.num_stages not in (p, 2 * p):
        raise ValueError(f"costs have {costs.num_stages} stages; give one per rank ({p}) "
                         f"or one per stage ({2 * p}) for {name}")  # fmt: skip
    costs = costs.for_stages(plain.stage_to_rank)
    sources = [plain]
    if name == "v-zb":
        sources.append(zb_v(p, m).renamed(name))
    cap = max(max(simulate(s, costs, check=False).peak_memory) for s in sources)
    sources += [reordered_schedule(block, m, costs, cap, passes=k) for k in (1, 2)]
    best, best_span = plain, float("inf")
    for source in sources:
        for candidate in (source, _place_ws(source, costs, cap)):
            result = simulate(candidate, costs, check=False)
            if max(result.peak_memory) <= cap * (1 + _EPS) and result.max_span < best_span - _EPS:
                best, best_span = candidate, result.max_span
    validate(best)
    return best


def _place_ws(order: Schedule, costs: CostModel, cap: float) -> Schedule:
    """``order``'s F/B sequence per rank with its Ws placed anew for ``costs``.

    Until a rank's last forward, each W runs right after its B (memory is tight there); after
    it, a W runs only in an idle stretch it fits in (before the next op's input arrives),
    the rest at the end. An op that would take the rank above ``cap`` runs pending Ws first.
    Ws feed nothing, so filling a stretch on one rank never moves another rank: the ranks
    advance like :func:`~nobubble.pipeline.simulate.simulate`'s worklist.
    """
    num_stages, owner, t_comm = order.num_stages, order.stage_to_rank, costs.t_comm
    rows = [[a for a in acts if a.op is not Op.W] for acts in order.rank_actions]
    last_f = [max((k for k, a in enumerate(row) if a.op is Op.F), default=-1) for row in rows]
    states = [_RankClock() for _ in rows]
    end: dict[DepKey, float] = {}
    waiting: dict[DepKey, list[int]] = {}
    ready = deque(range(len(rows)))
    while ready:
        r = ready.popleft()
        st, row = states[r], rows[r]
        while st.pos < len(row):
            a = row[st.pos]
            arrival, blocked = 0.0, None
            for dep in dependencies(a, num_stages):
                done = end.get(dep)
                if done is None:
                    blocked = dep
                    break
                arrival = max(arrival, done + (t_comm if owner[dep[1]] != r else 0.0))
            if blocked is not None:
                waiting.setdefault(blocked, []).append(r)
                break
            need = max(costs.memory_delta(a), costs.memory_transient(a), 0.0)
            while st.pending and st.memory + need > cap * (1 + _EPS):
                st.run(st.pending.popleft(), costs)
            while st.pending and st.clock + costs.duration(st.pending[0]) <= arrival + _EPS:
                st.run(st.pending.popleft(), costs)
            st.clock = max(st.clock, arrival)
            st.run(a, costs)
            end[dep_key(a)] = st.clock
            if a.op is Op.B:
                st.pending.append(Action(a.stage, Op.W, a.microbatch))
                if st.pos <= last_f[r]:
                    st.run(st.pending.popleft(), costs)
            st.pos += 1
            ready.extend(waiting.pop(dep_key(a), ()))
    if any(st.pos < len(row) for st, row in zip(states, rows)):
        return order  # cannot happen for a valid order; keep it as it is
    for st in states:
        while st.pending:
            st.run(st.pending.popleft(), costs)
    rows_out = tuple(tuple(st.order) for st in states)
    return Schedule(order.name, order.num_microbatches, owner, rows_out)


class _RankClock:
    """One rank while :func:`_place_ws` runs: position in its F/B row, clock, memory held,
    pending Ws (in the order of their Bs) and the order written so far."""

    def __init__(self) -> None:
        self.pos = 0
        self.clock = 0.0
        self.memory = 0.0
        self.pending: deque[Action] = deque()
        self.order: list[Action] = []

    def run(self, a: Action, costs: CostModel) -> None:
        self.clock += costs.duration(a)
        self.memory += costs.memory_delta(a)
        self.order.append(a)
