"""Pipeline schedules as data: ``Op``, ``Action``, ``Schedule`` and their text forms.

A schedule is, for every rank (device), the ordered list of compute actions it runs. An
action is one op on one microbatch on one *stage* (a contiguous group of layers). With one
stage per rank (1F1B, ZB-H1/H2, ZB-1p/2p) stage ``s`` lives on rank ``s``; interleaved and V
schedules put several stages ("chunks") on each rank, recorded by ``stage_to_rank``.

Ops (Zero Bubble splits the backward in two):

| Op | what | torch CSV letter | frees / needs |
|----|------|------------------|---------------|
| F | forward | ``F`` | stores activations |
| B | input gradient dX = dY W^T | ``I`` (BACKWARD_INPUT) | on the critical path |
| W | weight gradient dW = X^T dY | ``W`` (BACKWARD_WEIGHT) | needs only its own B |
| BW | fused backward (B then W) | ``B`` (FULL_BACKWARD) | 1F1B, GPipe |

``str(Action(2, Op.B, 0)) == "2I0"``, exactly the form ``torch.distributed.pipelining``
prints and reads, so :meth:`Schedule.to_csv` / :meth:`Schedule.from_csv` exchange the
"compute only" CSV that ``PipelineScheduleMulti._dump_csv`` / ``_load_csv`` use (one row per
rank, one cell per action, empty cells for idle steps).

This module only checks the *shape* of a schedule (stages on the right rank, indices in
range); dependency order and deadlocks are checked by :mod:`nobubble.pipeline.validate`.
"""

from __future__ import annotations

import csv
import io
import itertools
import os
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

from nobubble.files import read_input_text

__all__ = ["Op", "Action", "Schedule", "ScheduleFormatError"]


class ScheduleFormatError(ValueError):
    """A schedule whose text or structure cannot be read; the message names the cell/action."""


class Op(str, Enum):
    """A compute op of a pipeline stage on one microbatch."""

    F = "F"
    B = "B"  # input gradient only (torch: BACKWARD_INPUT, letter "I")
    W = "W"  # weight gradient only (torch: BACKWARD_WEIGHT, letter "W")
    BW = "BW"  # fused backward (torch: FULL_BACKWARD, letter "B")

    @property
    def torch_letter(self) -> str:
        """The letter ``torch.distributed.pipelining`` uses for this op."""
        return _TORCH_LETTER[self]

    @property
    def is_backward(self) -> bool:
        """True for B and BW: the ops that send a gradient to the previous stage."""
        return self is Op.B or self is Op.BW

    @staticmethod
    def from_torch_letter(letter: str) -> Op:
        try:
            return _FROM_TORCH_LETTER[letter]
        except KeyError:
            raise ScheduleFormatError(
                f"unknown op letter {letter!r}; use F (forward), I (input grad), "
                "W (weight grad) or B (full backward)"
            ) from None


_TORCH_LETTER = {Op.F: "F", Op.B: "I", Op.W: "W", Op.BW: "B"}
_FROM_TORCH_LETTER = {v: k for k, v in _TORCH_LETTER.items()}
_ACTION_RE = re.compile(r"^\s*(\d+)([FIWB])(\d+)\s*$")
# torch's non-compute actions (communication, FSDP, grad reduction): skipped on import
_TORCH_NON_COMPUTE = re.compile(r"^\s*\d*(UNSHARD|RESHARD|REDUCE_GRAD|SEND_F|RECV_F|SEND_B|RECV_B)")


@dataclass(frozen=True, slots=True, order=True)
class Action:
    """One op of one stage on one microbatch; printed like torch: ``"2F0"``, ``"2I0"``."""

    stage: int
    op: Op
    microbatch: int

    def __post_init__(self) -> None:
        if not isinstance(self.op, Op):
            object.__setattr__(self, "op", Op(self.op))
        if self.stage < 0 or self.microbatch < 0:
            raise ScheduleFormatError(
                f"action stage={self.stage} microbatch={self.microbatch}: indices must be >= 0"
            )

    def __str__(self) -> str:
        return f"{self.stage}{self.op.torch_letter}{self.microbatch}"

    @staticmethod
    def parse(text: str) -> Action:
        """Parse torch's form ``"<stage><F|I|W|B><microbatch>"``, e.g. ``"2I0"``."""
        match = _ACTION_RE.match(text)
        if match is None:
            raise ScheduleFormatError(
                f"cannot read action {text!r}; expected <stage><F|I|W|B><microbatch> like '2F0'"
            )
        stage, letter, mb = match.groups()
        return Action(int(stage), Op.from_torch_letter(letter), int(mb))


@dataclass(frozen=True, slots=True)
class Schedule:
    """Per-rank ordered compute actions of one training step.

    Attributes:
        name: a label (``"zb-h1"``, ``"imported"``).
        num_microbatches: m; microbatch indices run 0..m-1.
        stage_to_rank: ``stage_to_rank[s]`` is the rank that runs stage s; its length is the
            number of stages S (= num_ranks * num_chunks for interleaved / V shapes).
        rank_actions: ``rank_actions[r]`` is rank r's actions in execution order.

    Derived: ``num_stages`` (S), ``num_ranks`` (p), ``num_chunks`` (S // p, the virtual
    stages per rank), ``stages_of(r)``, ``uses_split_backward``.
    """

    name: str
    num_microbatches: int
    stage_to_rank: tuple[int, ...]
    rank_actions: tuple[tuple[Action, ...], ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "stage_to_rank", tuple(int(r) for r in self.stage_to_rank))
        object.__setattr__(self, "rank_actions", tuple(tuple(a) for a in self.rank_actions))
        p, s, m = len(self.rank_actions), len(self.stage_to_rank), self.num_microbatches
        if p < 1:
            raise ScheduleFormatError(f"schedule {self.name!r} has no ranks; give >= 1 rank")
        if s < p:
            raise ScheduleFormatError(
                f"schedule {self.name!r}: {s} stages for {p} ranks; every rank needs a stage"
            )
        if m < 1:
            raise ScheduleFormatError(f"schedule {self.name!r}: num_microbatches={m} must be >= 1")
        for stage, rank in enumerate(self.stage_to_rank):
            if not 0 <= rank < p:
                raise ScheduleFormatError(
                    f"stage_to_rank[{stage}]={rank} is outside ranks 0..{p - 1}"
                )
        if sorted(set(self.stage_to_rank)) != list(range(p)):
            missing = sorted(set(range(p)) - set(self.stage_to_rank))
            raise ScheduleFormatError(f"ranks {missing} run no stage; map a stage to every rank")
        for rank, actions in enumerate(self.rank_actions):
            for a in actions:
                if not isinstance(a, Action):
                    raise ScheduleFormatError(f"rank {rank}: {a!r} is not an Action")
                if a.stage >= s or a.microbatch >= m:
                    raise ScheduleFormatError(
                        f"rank {rank}: action {a} is outside stages 0..{s - 1} / "
                        f"microbatches 0..{m - 1}"
                    )
                if self.stage_to_rank[a.stage] != rank:
                    raise ScheduleFormatError(
                        f"action {a} is on rank {rank} but stage {a.stage} belongs to rank "
                        f"{self.stage_to_rank[a.stage]}"
                    )

    # -- derived shape -------------------------------------------------------------------
    @property
    def num_stages(self) -> int:
        return len(self.stage_to_rank)

    @property
    def num_ranks(self) -> int:
        return len(self.rank_actions)

    @property
    def num_chunks(self) -> int:
        """Virtual stages per rank (1 for plain 1F1B/ZB, v for interleaved, 2 for V)."""
        return self.num_stages // self.num_ranks

    @property
    def num_actions(self) -> int:
        return sum(len(a) for a in self.rank_actions)

    @property
    def shape(self) -> dict[str, int]:
        """Its size as the commands report it: stages (ranks), chunks, microbatches, actions."""
        return {"stages": self.num_ranks, "chunks": self.num_chunks,
                "microbatches": self.num_microbatches, "actions": self.num_actions}  # fmt: skip

    def as_dict(self) -> dict:
        """JSON-ready: the name, :attr:`shape`, stage_to_rank and each rank's actions as text."""
        return {"schedule": self.name, **self.shape, "stage_to_rank": list(self.stage_to_rank),
                "actions": [[str(a) for a in acts] for acts in self.rank_actions]}  # fmt: skip

    @property
    def uses_split_backward(self) -> bool:
        """True if any backward is split into B and W (zero-bubble style)."""
        return any(a.op is Op.B for acts in self.rank_actions for a in acts)

    def stages_of(self, rank: int) -> tuple[int, ...]:
        """The stages rank ``rank`` runs, ascending."""
        return tuple(s for s, r in enumerate(self.stage_to_rank) if r == rank)

    def rank_of(self, stage: int) -> int:
        return self.stage_to_rank[stage]

    def actions(self) -> Iterator[tuple[int, int, Action]]:
        """Yield ``(rank, position, action)`` for every action."""
        for rank, acts in enumerate(self.rank_actions):
            for pos, a in enumerate(acts):
                yield rank, pos, a

    def renamed(self, name: str) -> Schedule:
        return Schedule(name, self.num_microbatches, self.stage_to_rank, self.rank_actions)

    # -- constructors ---------------------------------------------------------------------
    @staticmethod
    def from_rank_actions(
        rank_actions: Sequence[Iterable[Action | str]],
        *,
        name: str = "custom",
        num_microbatches: int | None = None,
        stage_to_rank: Sequence[int] | None = None,
    ) -> Schedule:
        """Build a schedule from per-rank action lists (``Action`` or torch strings).

        ``num_microbatches`` defaults to 1 + the largest microbatch index; ``stage_to_rank``
        is inferred from where each stage's actions appear (each stage on exactly one rank).
        """
        rows = [
            tuple(a if isinstance(a, Action) else Action.parse(a) for a in acts)
            for acts in rank_actions
        ]
        all_actions = [a for row in rows for a in row]
        if num_microbatches is None:
            num_microbatches = 1 + max((a.microbatch for a in all_actions), default=0)
        if stage_to_rank is None:
            stage_to_rank = _infer_stage_to_rank(rows)
        return Schedule(name, num_microbatches, tuple(stage_to_rank), tuple(rows))

    @staticmethod
    def from_csv(
        text: str, *, name: str = "imported", num_microbatches: int | None = None
    ) -> Schedule:
        """Read torch's compute-only CSV (one row per rank; empty cells are idle steps).

        Non-compute cells torch may add (``0REDUCE_GRAD``, ``1UNSHARD``, send/recv) are
        skipped: the simulator models communication itself. An overlapped cell
        ``(0F7;7B3)OVERLAP_F_B`` (DualPipeV) is read as its sub-actions in order.
        """
        rows: list[list[Action]] = []
        reader = csv.reader(io.StringIO(text))
        line_no = 0
        try:
            for line_no, row in enumerate(reader, start=1):
                actions = []
                for cell in row:
                    if not cell.strip() or _TORCH_NON_COMPUTE.match(cell):
                        continue
                    try:
                        actions.extend(_parse_cell(cell))
                    except ScheduleFormatError as err:
                        raise ScheduleFormatError(f"CSV line {line_no}: {err}") from None
                rows.append(actions)
        except csv.Error as err:  # a lone carriage return, a cell past the field limit
            raise ScheduleFormatError(
                f"CSV line {reader.line_num}: {err}; expected rows of cells like 0F0,0I0,0W0 "
                "separated by newlines"
            ) from None
        while rows and not rows[-1]:
            rows.pop()  # trailing blank lines
        if not rows:
            raise ScheduleFormatError("CSV holds no actions; expected one row of actions per rank")
        return Schedule.from_rank_actions(rows, name=name, num_microbatches=num_microbatches)

    @staticmethod
    def read_csv(path: str | os.PathLike[str], *, num_microbatches: int | None = None) -> Schedule:
        """:meth:`from_csv` of the file at ``path`` (:meth:`to_csv`'s format, torch's), named
        after the file's stem.

        Raises:
            ScheduleFormatError: the file cannot be read, is not UTF-8 text, or holds no
                schedule; the error names the file.
        """
        text = read_input_text(path, "give a torch-format CSV schedule", ScheduleFormatError)
        try:
            return Schedule.from_csv(text, name=Path(path).stem, num_microbatches=num_microbatches)
        except ScheduleFormatError as err:
            raise ScheduleFormatError(f"{path}: {err}") from None

    @staticmethod
    def from_torch_order(
        pipeline_order: Mapping[int, Sequence[object | None]],
        *,
        name: str = "torch",
        num_microbatches: int | None = None,
    ) -> Schedule:
        """Import a ``torch.distributed.pipelining`` schedule's ``pipeline_order``.

        ``pipeline_order`` maps rank -> list of ``_Action | None``; each action is read from
        its ``str()`` (so torch need not be imported here).
        """
        ranks = sorted(pipeline_order)
        if ranks != list(range(len(ranks))):
            raise ScheduleFormatError(f"pipeline_order ranks {ranks} are not 0..p-1")
        text = io.StringIO()
        writer = csv.writer(text)
        for r in ranks:
            writer.writerow(["" if a is None else str(a) for a in pipeline_order[r]])
        return Schedule.from_csv(text.getvalue(), name=name, num_microbatches=num_microbatches)

    # -- text forms -----------------------------------------------------------------------
    def to_csv(self) -> str:
        """torch's compute-only CSV: one row per rank, cells like ``0F0``, ``0I0``, ``0W0``."""
        out = io.StringIO()
        writer = csv.writer(out, lineterminator="\n")
        for acts in self.rank_actions:
            writer.writerow([str(a) for a in acts])
        return out.getvalue()


def _parse_cell(cell: str) -> list[Action]:
    """One CSV cell: an action, or torch's overlapped pair ``(0F7;7B3)OVERLAP_F_B``, read as
    its sub-actions in order."""
    text = cell.strip()
    if text.startswith("(") and ")" in text:
        inner = text[1 : text.index(")")]
        return [Action.parse(part) for part in inner.split(";") if part.strip()]
    return [Action.parse(text)]


def _infer_stage_to_rank(rows: Sequence[Sequence[Action]]) -> tuple[int, ...]:
    owner: dict[int, int] = {}
    for rank, row in enumerate(rows):
        for a in row:
            prev = owner.setdefault(a.stage, rank)
            if prev != rank:
                raise ScheduleFormatError(
                    f"stage {a.stage} appears on ranks {prev} and {rank} (action {a}); "
                    "a stage must run on exactly one rank"
                )
    num_stages = 1 + max(owner, default=-1)
    if len(owner) < num_stages:  # name the first few: a stage index of 10**9 is 10**9 gaps
        first = list(itertools.islice((s for s in range(num_stages) if s not in owner), 5))
        more = num_stages - len(owner) - len(first)
        listed = ", ".join(map(str, first)) + (f" and {more:,} more" if more else "")
        which = f"stage {listed} has" if len(first) == 1 and not more else f"stages {listed} have"
        raise ScheduleFormatError(f"{which} no actions; cannot infer their rank")
    return tuple(owner[s] for s in range(num_stages))
