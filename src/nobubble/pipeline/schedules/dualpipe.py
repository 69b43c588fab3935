"""DualPipe and DualPipeV (DeepSeek-V3, 2024): two chunks per rank, and the forward of one
microbatch overlapped with the backward of another in F&B cells.

DualPipeV is a V (rank r holds stages r and 2p-1-r), laid out in DeepSeek's eight phases per
rank; deferred Ws form one first-in first-out queue per rank. Below n = 2p microbatches the
phases are laid out for 2p and the missing microbatches' actions dropped (still valid).
:class:`OverlappedSchedule` keeps the cells beside the plain order (``pairs[r]``: the
positions on rank r where a cell starts). DualPipe (even p, even m) is two pipelines over
two model copies, not a :class:`~nobubble.pipeline.actions.Schedule`: :class:`DualPipe`
keeps both (:meth:`DualPipe.pipeline`), its per-rank interleaving, and its fold (DualPipeV on
p/2 ranks with m/2 microbatches), which gives its figures exactly at T_comm = 0 and a lower
bound otherwise. See docs/pipeline/schedules.md, "DualPipe and DualPipeV".
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from nobubble.pipeline.actions import Action, Op, Schedule
from nobubble.pipeline.schedules.handwritten import check_sizes
from nobubble.pipeline.schedules.v_shape import v_stage_to_rank

__all__ = ["OverlappedSchedule", "DualPipe", "Direction", "dualpipev", "dualpipe"]

Direction = Literal["forward", "reverse"]
Cell = tuple[Action, ...]  # one action, or an overlapped (F, BW) pair
_DOWN, _UP = 0, 1


@dataclass(frozen=True, slots=True)
class OverlappedSchedule:
    """A schedule whose F&B cells are recorded.

    Attributes:
        schedule: the per-rank order; a cell is its F then its BW at consecutive positions.
        pairs: ``pairs[r]`` holds, ascending, each position k on rank r where a cell starts:
            ``rank_actions[r][k]`` is its F and ``rank_actions[r][k + 1]`` its backward (of
            another stage and microbatch); cells do not overlap.
    """

    schedule: Schedule
    pairs: tuple[tuple[int, ...], ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "pairs", tuple(tuple(int(k) for k in ks) for ks in self.pairs))
        if len(self.pairs) != self.schedule.num_ranks:
            raise ValueError(
                f"pairs has {len(self.pairs)} rows for {self.schedule.num_ranks} ranks; "
                "give one row of cell positions per rank"
            )
        for rank, (acts, ks) in enumerate(zip(self.schedule.rank_actions, self.pairs)):
            for prev, k in zip((-2, *ks), ks):
                if k < prev + 2 or k + 1 >= len(acts):
                    raise ValueError(
                        f"rank {rank}: cell position {k} overlaps the previous cell or runs "
                        f"past the rank's {len(acts)} actions"
                    )
                f, b = acts[k], acts[k + 1]
                if f.op is not Op.F or not b.op.is_backward or f.stage == b.stage:
                    raise ValueError(
                        f"rank {rank}: cell at {k} is ({f}, {b}); a cell is an F followed by "
                        "a backward of another stage"
                    )

    @property
    def name(self) -> str:
        return self.schedule.name

    def cells(self, rank: int) -> tuple[Cell, ...]:
        """Rank ``rank``'s order as a runtime would issue it: each cell one 2-tuple, every
        other action alone."""
        acts, starts = self.schedule.rank_actions[rank], set(self.pairs[rank])
        out: list[Cell] = []
        k = 0
        while k < len(acts):
            width = 2 if k in starts else 1
            out.append(acts[k : k + width])
            k += width
        return tuple(out)

    def to_torch_csv(self) -> str:
        """torch's compute-only CSV with cells written ``(0F7;7B3)OVERLAP_F_B`` (as
        ``ScheduleDualPipeV`` dumps them); :meth:`Schedule.from_csv` reads it back."""
        lines = []
        for rank in range(self.schedule.num_ranks):
            texts = [
                f"({';'.join(map(str, cell))})OVERLAP_F_B" if len(cell) == 2 else str(cell[0])
                for cell in self.cells(rank)
            ]
            lines.append(",".join(texts))
        return "\n".join(lines) + "\n"


class _RankOrder:
    """One rank's order while it is written: next microbatch per (chunk, op), the queue of
    deferred Ws (oldest first), and the cells written so far."""

    def __init__(self, stages: tuple[int, int]):
        self.stages = stages
        self.next_f = [0, 0]
        self.next_b = [0, 0]
        self.deferred_w: deque[Action] = deque()
        self.cells: list[Cell] = []

    def _f(self, chunk: int) -> Action:
        self.next_f[chunk] += 1
        return Action(self.stages[chunk], Op.F, self.next_f[chunk] - 1)

    def _b(self, chunk: int, *, split: bool) -> Action:
        mb = self.next_b[chunk]
        self.next_b[chunk] += 1
        if not split:
            return Action(self.stages[chunk], Op.BW, mb)
        self.deferred_w.append(Action(self.stages[chunk], Op.W, mb))
        return Action(self.stages[chunk], Op.B, mb)

    def forward(self, chunk: int) -> None:
        self.cells.append((self._f(chunk),))

    def backward(self, chunk: int, *, split: bool = False) -> None:
        """A fused backward, or (``split``) its B now and its W queued."""
        self.cells.append((self._b(chunk, split=split),))

    def weight(self) -> None:
        """The oldest deferred W."""
        assert self.deferred_w, "a W was asked for with none deferred"
        self.cells.append((self.deferred_w.popleft(),))

    def overlapped(self, f_chunk: int, b_chunk: int) -> None:
        """One F&B cell: F of ``f_chunk`` and the fused backward of ``b_chunk``."""
        self.cells.append((self._f(f_chunk), self._b(b_chunk, split=False)))


def _dualpipev_rank(p: int, r: int, n: int) -> list[Cell]:
    """Rank r's cells for p ranks and n >= 2p microbatches, DeepSeek's eight phases:

    1. ``2(p - r - 1)`` forwards of chunk 0; 2. ``r + 1`` rounds of (F down, F up);
    3. ``p - r - 1`` rounds of (B up, the oldest deferred W, F up);
    4. ``n - 2p + r + 1`` rounds of two cells, (F down & BW up) then (F up & BW down), the
       last rank's first (F down, BW up) as two plain actions;
    5. ``p - r - 1`` rounds of (BW up, then the cell F up & BW down);
    6. ``r + 1`` rounds of (backward up, backward down), the second half split (W deferred);
    7. ``p - r - 1`` rounds of (the oldest deferred W, B down); 8. the deferred Ws, oldest first.
    """
    o = _RankOrder((r, 2 * p - 1 - r))
    for _ in range(2 * (p - r - 1)):  # 1
        o.forward(_DOWN)
    for _ in range(r + 1):  # 2
        o.forward(_DOWN)
        o.forward(_UP)
    for _ in range(p - r - 1):  # 3
        o.backward(_UP, split=True)
        o.weight()
        o.forward(_UP)
    for i in range(n - 2 * p + r + 1):  # 4
        if i == 0 and r == p - 1:
            o.forward(_DOWN)
            o.backward(_UP)
        else:
            o.overlapped(_DOWN, _UP)
        o.overlapped(_UP, _DOWN)
    for _ in range(p - r - 1):  # 5
        o.backward(_UP)
        o.overlapped(_UP, _DOWN)
    for j in range(2 * (r + 1)):  # 6
        o.backward(_UP if j % 2 == 0 else _DOWN, split=j >= r + 1)
    for _ in range(p - r - 1):  # 7
        o.weight()
        o.backward(_DOWN, split=True)
    while o.deferred_w:  # 8
        o.weight()
    assert o.next_f == o.next_b == [n, n], (p, r, n, o.next_f, o.next_b)
    return o.cells


def _flatten(
    cells: Sequence[Cell], num_microbatches: int
) -> tuple[tuple[Action, ...], tuple[int, ...]]:
    """Actions and cell positions of one rank, the microbatches >= ``num_microbatches``
    dropped (a cell that keeps one action becomes a plain action)."""
    actions: list[Action] = []
    pairs: list[int] = []
    for cell in cells:
        kept = [a for a in cell if a.microbatch < num_microbatches]
        if len(kept) == 2:
            pairs.append(len(actions))
        actions.extend(kept)
    return tuple(actions), tuple(pairs)


def dualpipev(num_ranks: int, num_microbatches: int) -> OverlappedSchedule:
    """DualPipeV for ``num_ranks`` ranks (2 * num_ranks stages in a V) and
    ``num_microbatches``; any sizes >= 1 (below 2p microbatches the missing ones are
    dropped, see the module docstring). Returns the schedule and its F&B cells."""
    check_sizes(num_ranks, num_microbatches)
    p, m = num_ranks, num_microbatches
    n = max(m, 2 * p)
    rows = [_flatten(_dualpipev_rank(p, r, n), m) for r in range(p)]
    sched = Schedule("dualpipev", m, v_stage_to_rank(p), tuple(acts for acts, _ in rows))
    return OverlappedSchedule(sched, tuple(pairs for _, pairs in rows))


@dataclass(frozen=True, slots=True)
class DualPipe:
    """DualPipe's bidirectional order on ``num_ranks`` ranks (see the module docstring).

    Attributes:
        num_ranks: p (even).
        num_microbatches: m (even); m/2 run each direction, numbered 0..m/2-1 in each.
        order: ``order[r]`` is rank r's actions in execution order, each with its direction;
            ``("forward", Action(s, ...))`` is stage s of the forward pipeline (on rank s),
            ``("reverse", Action(s, ...))`` stage s of the reverse one (on rank p-1-s).
        pairs: ``pairs[r]``: the positions in ``order[r]`` where an F&B cell starts (its F,
            then at the next position its BW, of the other direction).
        folded: DualPipeV on p/2 ranks with m/2 microbatches, whose V-rank h order ranks h
            and p-1-h run; simulate it for DualPipe's bubble and memory.
    """

    num_ranks: int
    num_microbatches: int
    order: tuple[tuple[tuple[Direction, Action], ...], ...]
    pairs: tuple[tuple[int, ...], ...]
    folded: OverlappedSchedule

    def pipeline(self, direction: Direction) -> Schedule:
        """One direction's actions as a Schedule of p stages and m/2 microbatches: every
        rank's subsequence of that direction, in order."""
        p = self.num_ranks
        stage_to_rank = tuple(range(p)) if direction == "forward" else tuple(range(p - 1, -1, -1))
        rows = tuple(tuple(a for d, a in acts if d == direction) for acts in self.order)
        return Schedule(f"dualpipe-{direction}", self.num_microbatches // 2, stage_to_rank, rows)


def dualpipe(num_ranks: int, num_microbatches: int) -> DualPipe:
    """DualPipe for an even ``num_ranks`` p and an even ``num_microbatches`` m (m/2 per
    direction); the fold of :func:`dualpipev` ``(p/2, m/2)``."""
    check_sizes(num_ranks, num_microbatches)
    p, m = num_ranks, num_microbatches
    if p % 2:
        raise ValueError(
            f"DualPipe needs an even number of ranks (its two directions meet in the middle); "
            f"num_ranks={p}: use {p + 1} ranks, or dualpipev, which takes any number"
        )
    if m % 2:
        raise ValueError(
            f"DualPipe runs half the microbatches in each direction; num_microbatches={m} is "
            f"odd: use {m + 1}"
        )
    folded = dualpipev(p // 2, m // 2)
    order, pairs = [], []
    for r in range(p):
        h = min(r, p - 1 - r)
        # chunk 0 runs the direction that enters on this rank's side of the middle
        by_chunk: tuple[Direction, Direction] = (
            ("forward", "reverse") if r < p // 2 else ("reverse", "forward")
        )
        order.append(
            tuple(
                (by_chunk[0 if a.stage < p // 2 else 1], a) for a in folded.schedule.rank_actions[h]
            )
        )
        pairs.append(folded.pairs[h])
    return DualPipe(p, m, tuple(order), tuple(pairs), folded)
