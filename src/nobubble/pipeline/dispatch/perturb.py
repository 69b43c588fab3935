"""Perturbations of op durations: seeded per-op jitter and straggler ranks.

A :class:`Perturbation` turns the nominal cost model into the durations one training step
really takes. Two kinds compose by multiplication:

- *jitter* ``J``: every op (stage, op, microbatch) takes its nominal time times a factor
  drawn uniformly from ``[1 - J, 1 + J]``. The factor belongs to the op, not to the moment
  it runs, so two dispatch policies that run the same ops in different orders face exactly
  the same durations, and the comparison between them is paired.
- *straggler* ``RANK:FACTOR[:STEPS]``: every op on that rank takes ``FACTOR`` times longer
  (a slower device, a noisy neighbour), during the training steps ``STEPS`` (all steps when
  left out). ``STEPS`` is ``N`` (steps 0..N-1), ``A-B`` (steps A to B, both included) or
  ``A-`` (step A onwards).

Transfers (``t_comm``) are left as they are: the model slows compute, not the links.
The draws come from ``random.Random(f"{seed}:{step}")`` in a fixed order over the ops, so
a seed names one set of durations on every machine and Python version that keeps
``random``'s seeding of strings (sha512, stable since 3.2).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from nobubble.pipeline.actions import Action, Op
from nobubble.pipeline.costs import CostModel
from nobubble.validation import finite

__all__ = ["Straggler", "Perturbation", "OpDurations", "parse_straggler"]

_OPS = (Op.F, Op.B, Op.W, Op.BW)  # the order of the draws; index = position in the table
_OP_INDEX = {op: k for k, op in enumerate(_OPS)}


@dataclass(frozen=True, slots=True)
class Straggler:
    """One slow rank: its ops take ``factor`` times their time during steps
    ``first_step..last_step`` (``last_step=None``: no end)."""

    rank: int
    factor: float
    first_step: int = 0
    last_step: int | None = None

    def __post_init__(self) -> None:
        if not (isinstance(self.rank, int) and self.rank >= 0):
            raise ValueError(f"Straggler.rank={self.rank!r} must be an integer >= 0")
        if not (finite(self.factor) and self.factor > 0):
            raise ValueError(
                f"Straggler.factor={self.factor!r} must be finite and > 0 (1.5: 50% slower)"
            )
        if self.first_step < 0 or (self.last_step is not None and self.last_step < self.first_step):
            raise ValueError(
                f"Straggler steps {self.first_step}-{self.last_step} are not a range of steps "
                ">= 0; give N, A-B with A <= B, or A-"
            )

    def active(self, step: int) -> bool:
        """Whether this rank is slow in training step ``step``."""
        return self.first_step <= step and (self.last_step is None or step <= self.last_step)

    def __str__(self) -> str:
        if self.first_step == 0 and self.last_step is None:
            return f"{self.rank}:{self.factor:g}"
        last = "" if self.last_step is None else str(self.last_step)
        return f"{self.rank}:{self.factor:g}:{self.first_step}-{last}"


def parse_straggler(text: str) -> Straggler:
    """Read ``RANK:FACTOR[:STEPS]`` (``"1:1.5"``, ``"1:1.5:3"``, ``"1:1.5:2-4"``, ``"1:1.5:2-"``).

    Raises ValueError naming the text, the bad part and the expected form.
    """
    form = "expected RANK:FACTOR[:STEPS], e.g. 1:1.5 or 1:1.5:0-9"
    parts = text.split(":")
    if len(parts) not in (2, 3):
        raise ValueError(f"straggler {text!r}: {form}")
    try:
        rank = int(parts[0])
    except ValueError:
        raise ValueError(
            f"straggler {text!r}: RANK {parts[0]!r} is not an integer; {form}"
        ) from None
    if rank < 0:
        raise ValueError(f"straggler {text!r}: RANK {rank} must be >= 0")
    try:
        factor = float(parts[1])
    except ValueError:
        raise ValueError(
            f"straggler {text!r}: FACTOR {parts[1]!r} is not a number; {form}"
        ) from None
    if not (finite(factor) and factor > 0):
        raise ValueError(
            f"straggler {text!r}: FACTOR {parts[1]} must be finite and > 0 (1.5: 50% slower)"
        )
    first, last = (0, None) if len(parts) == 2 else _parse_steps(text, parts[2], form)
    return Straggler(rank, factor, first, last)


def _parse_steps(text: str, steps: str, form: str) -> tuple[int, int | None]:
    try:
        if "-" not in steps:
            count = int(steps)
            if count < 1:
                raise ValueError
            return 0, count - 1
        first_text, last_text = steps.split("-", 1)
        first, last = int(first_text), int(last_text) if last_text else None
        if first < 0 or (last is not None and last < first):
            raise ValueError
        return first, last
    except ValueError:
        raise ValueError(
            f"straggler {text!r}: STEPS {steps!r} must be N >= 1 (the first N steps), A-B with "
            f"0 <= A <= B, or A- (steps count from 0); {form}"
        ) from None


@dataclass(frozen=True, slots=True, kw_only=True)
class Perturbation:
    """Per-op jitter and stragglers for one simulated step (module docstring)."""

    jitter: float = 0.0
    """Half-width J of the uniform duration factor ``[1 - J, 1 + J]``; ``0 <= J < 1``."""
    stragglers: tuple[Straggler, ...] = field(default=())
    """Slow ranks; two entries for one rank multiply."""
    seed: int = 0
    """Seed of the jitter draws (the same seed gives the same durations)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "stragglers", tuple(self.stragglers))
        if not (finite(self.jitter) and 0 <= self.jitter < 1):
            raise ValueError(
                f"jitter={self.jitter!r} must be >= 0 and < 1 (0.2 draws factors in [0.8, 1.2])"
            )

    @property
    def is_identity(self) -> bool:
        """True when no duration changes (no jitter, no straggler)."""
        return self.jitter == 0 and not self.stragglers

    def check_ranks(self, num_ranks: int) -> None:
        """Refuse a straggler on a rank the pipeline does not have."""
        for s in self.stragglers:
            if s.rank >= num_ranks:
                raise ValueError(
                    f"straggler rank {s.rank} is outside ranks 0..{num_ranks - 1}; "
                    "give a rank of the pipeline"
                )

    def durations(
        self, costs: CostModel, stage_to_rank: tuple[int, ...], num_microbatches: int, *,
        step: int = 0,
    ) -> OpDurations:  # fmt: skip
        """The perturbed duration of every op of one step (``costs`` one entry per stage)."""
        num_ranks = 1 + max(stage_to_rank)
        self.check_ranks(num_ranks)
        rank_factor = [1.0] * num_ranks
        for s in self.stragglers:
            if s.active(step):
                rank_factor[s.rank] *= s.factor
        rng = random.Random(f"{self.seed}:{step}")
        j, m = self.jitter, num_microbatches
        table = tuple(
            tuple(
                tuple(
                    costs.duration(Action(stage, op, i))
                    * rank_factor[rank]
                    * (rng.uniform(1 - j, 1 + j) if j > 0 else 1.0)
                    for i in range(m)
                )  # (m,)
                for stage, rank in enumerate(stage_to_rank)
            )  # (S, m)
            for op in _OPS
        )  # (4, S, m)
        return OpDurations(table)


@dataclass(frozen=True, slots=True)
class OpDurations:
    """``table[k][stage][microbatch]``: the duration of op ``_OPS[k]`` (F, B, W, BW)."""

    table: tuple[tuple[tuple[float, ...], ...], ...]

    def of(self, action: Action) -> float:
        return self.table[_OP_INDEX[action.op]][action.stage][action.microbatch]
