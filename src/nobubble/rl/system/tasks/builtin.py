"""The built-in tasks, whose evaluation set is their whole prompt space (accuracy is exact
match over every prompt), and the character tokenizer.

Any object with a verifier, prompts and room for a response is a task too (see
:mod:`~nobubble.rl.system.tasks.spec`).
"""

from __future__ import annotations

import os.path
from dataclasses import dataclass, field
from typing import ClassVar

from nobubble.rl.system.imports import check_kwargs

__all__ = ["CharTokenizer", "DigitsTask", "SumDigitsTask", "make_task", "TASK_NAMES"]


@dataclass(frozen=True)
class CharTokenizer:
    """Characters to ids: ``<pad>`` = 0, ``<bos>`` = 1, ``<eos>`` = 2, then the alphabet."""

    alphabet: str
    itos: tuple[str, ...] = field(init=False)
    pad_id: ClassVar[int] = 0
    bos_id: ClassVar[int] = 1
    eos_id: ClassVar[int] = 2

    def __post_init__(self) -> None:
        if len(set(self.alphabet)) != len(self.alphabet):
            raise ValueError(f"alphabet {self.alphabet!r} repeats a character")
        object.__setattr__(self, "itos", ("<pad>", "<bos>", "<eos>", *self.alphabet))

    @property
    def vocab_size(self) -> int:
        return len(self.itos)

    def encode(self, text: str) -> list[int]:
        """``<bos>`` followed by the characters of ``text``."""
        try:
            return [self.bos_id, *(self.alphabet.index(c) + 3 for c in text)]
        except ValueError:
            bad = sorted(set(text) - set(self.alphabet))
            raise ValueError(f"text {text!r} has characters {bad} outside the alphabet") from None

    def decode_response(self, ids: list[int]) -> str:
        """The characters before the first ``<eos>``; ``<pad>``/``<bos>`` are dropped."""
        end = ids.index(self.eos_id) if self.eos_id in ids else len(ids)
        return "".join(self.itos[i] for i in ids[:end] if i >= 3)


@dataclass(frozen=True, kw_only=True)
class _AnswerTask:
    """A task with one right answer per prompt (:meth:`answer`), rewarded densely."""

    tokenizer: CharTokenizer = field(default=CharTokenizer("0123456789,:="), init=False)

    def answer(self, prompt: str) -> str:
        raise NotImplementedError

    def reward(self, prompt: str, response: str) -> float:
        """Fraction of the answer's characters right before the first wrong one, in [0, 1];
        1 iff exact (a response longer than the answer is wrong past its end)."""
        want = self.answer(prompt)
        right = len(os.path.commonprefix([want, response]))
        if right == len(want) < len(response):
            right -= 1
        return right / len(want)


@dataclass(frozen=True, kw_only=True)
class DigitsTask(_AnswerTask):
    """Digit completion: ``"a,b:m,n"`` -> the next ``n`` terms of ``a, b, ...`` modulo ``m``,
    one digit each: ``t_k = (b + k (b - a)) mod m``.

    Attributes:
        moduli: the values of ``m`` (2..9, one character each).
        num_terms: the values of ``n`` (1..9).
        differences: the common differences ``d = b - a`` the prompts use (taken mod ``m``);
            ``None`` means every ``d`` in ``0..m-1`` (harder to learn: docs/rl/system.md).
    """

    moduli: tuple[int, ...] = (5, 7, 9)
    num_terms: tuple[int, ...] = (3,)
    differences: tuple[int, ...] | None = (1,)
    name: str = "digits"

    def __post_init__(self) -> None:
        if not self.moduli or any(not 2 <= m <= 9 for m in self.moduli):
            raise ValueError(f"moduli={self.moduli} must be non-empty values in 2..9 (one digit)")
        if not self.num_terms or any(not 1 <= n <= 9 for n in self.num_terms):
            raise ValueError(f"num_terms={self.num_terms} must be non-empty values in 1..9")
        if self.differences is not None and not self.differences:
            raise ValueError("differences=() is empty; pass None for every difference")

    @property
    def max_new_tokens(self) -> int:
        return max(self.num_terms)

    def response_budget(self, prompt: str) -> int:
        """``n`` tokens: the prompt asks for ``n`` terms (an ``<eos>`` may end it sooner)."""
        return int(prompt[-1])

    def eval_prompts(self) -> list[str]:
        return [
            f"{a},{(a + d) % m}:{m},{n}"
            for m in self.moduli
            for n in self.num_terms
            for a in range(m)
            for d in (
                range(m) if self.differences is None else sorted({x % m for x in self.differences})
            )
        ]

    def answer(self, prompt: str) -> str:
        a, b, m, n = (int(x) for x in prompt.replace(":", ",").split(","))
        return "".join(str((b + k * (b - a)) % m) for k in range(1, n + 1))


@dataclass(frozen=True, kw_only=True)
class SumDigitsTask(_AnswerTask):
    """Sum of digits: ``"d1d2...dL="`` -> ``str(d1 + ... + dL)``; ``num_digits``: L, 1..4 (the
    evaluation set has 10**L prompts)."""

    num_digits: int = 2
    name: str = "sum"

    def __post_init__(self) -> None:
        if not 1 <= self.num_digits <= 4:
            raise ValueError(f"num_digits={self.num_digits} must be in 1..4 (10**L eval prompts)")

    @property
    def max_new_tokens(self) -> int:
        return len(str(9 * self.num_digits)) + 1  # the longest sum and its <eos>

    def eval_prompts(self) -> list[str]:
        return [f"{i:0{self.num_digits}d}=" for i in range(10**self.num_digits)]

    def answer(self, prompt: str) -> str:
        return str(sum(int(c) for c in prompt[:-1]))


TASKS: dict[str, type[DigitsTask] | type[SumDigitsTask]] = {
    "digits": DigitsTask,
    "sum": SumDigitsTask,
}
TASK_NAMES = tuple(TASKS)


def make_task(name: str, **kwargs) -> DigitsTask | SumDigitsTask:
    """The built-in task ``name`` with its keyword settings (ValueError naming an unknown
    name or setting, with those it takes)."""
    if name not in TASKS:
        raise ValueError(f"unknown task {name!r}; choose one of {', '.join(TASK_NAMES)}")
    check_kwargs(TASKS[name], kwargs, "task_kwargs")
    return TASKS[name](**kwargs)
