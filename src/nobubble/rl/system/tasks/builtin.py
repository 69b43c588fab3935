"""The built-in tasks with verifiable rewards and an enumerable evaluation set.

Any object with a verifier, prompts and room for a response is a task too (see
:mod:`~nobubble.rl.system.tasks.spec`: what a task needs, and what it may leave out).

- :class:`DigitsTask` - digit completion. The prompt ``"a,b:m,n"`` gives the first two terms
  of an arithmetic sequence modulo ``m`` and asks for the next ``n`` terms, written as one
  digit each, ``"t1t2...tn"``: ``t_k = (b + k (b - a)) mod m``. The reward is dense: the
  fraction of the ``n`` terms that are right before the first wrong one (the correct prefix).
- :class:`SumDigitsTask` - sum of digits. The prompt is ``L`` digits followed by ``=``; the
  answer is their decimal sum. Dense reward: the correct prefix of the answer's characters.

Every task enumerates its whole prompt space (:meth:`eval_prompts`), so accuracy is exact
match over all prompts, not a sample.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from nobubble.rl.system.imports import check_kwargs

__all__ = ["CharTokenizer", "DigitsTask", "SumDigitsTask", "make_task", "TASK_NAMES"]

PAD, BOS, EOS = "<pad>", "<bos>", "<eos>"


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
        object.__setattr__(self, "itos", (PAD, BOS, EOS, *self.alphabet))

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
        out = []
        for i in ids:
            if i == self.eos_id:
                break
            if i >= 3:
                out.append(self.itos[i])
        return "".join(out)


def _prefix_fraction(want: list[str], got: list[str]) -> float:
    right = 0
    for w, g in zip(want, got):
        if w != g:
            break
        right += 1
    # a response longer than the answer is wrong past the answer's end
    if right == len(want) and len(got) > len(want):
        right -= 1
    return right / len(want)


@dataclass(frozen=True, kw_only=True)
class DigitsTask:
    """Digit completion: ``"a,b:m,n"`` -> the next ``n`` terms of ``a, b, ...`` modulo ``m``.

    Attributes:
        moduli: the values of ``m`` (2..9, one character each).
        num_terms: the values of ``n`` (1..9).
        differences: the common differences ``d = b - a`` the prompts use (taken mod ``m``);
            ``None`` means every ``d`` in ``0..m-1``. Small differences give the policy a
            signal to climb: with all differences, no single prompt digit says anything
            about the answer (the table is XOR-like) and a random policy learns slowly.
    """

    moduli: tuple[int, ...] = (5, 7, 9)
    num_terms: tuple[int, ...] = (3,)
    differences: tuple[int, ...] | None = (1,)
    name: str = "digits"
    tokenizer: CharTokenizer = field(default=CharTokenizer("0123456789,:="), init=False)

    def __post_init__(self) -> None:
        if not self.moduli or any(not 2 <= m <= 9 for m in self.moduli):
            raise ValueError(f"moduli={self.moduli} must be non-empty values in 2..9 (one digit)")
        if not self.num_terms or any(not 1 <= n <= 9 for n in self.num_terms):
            raise ValueError(f"num_terms={self.num_terms} must be non-empty values in 1..9")
        if self.differences is not None and not self.differences:
            raise ValueError("differences=() is empty; pass None for every difference")

    def _diffs(self, m: int) -> list[int]:
        if self.differences is None:
            return list(range(m))
        return sorted({d % m for d in self.differences})

    @property
    def max_new_tokens(self) -> int:
        return max(self.num_terms)

    def response_budget(self, prompt: str) -> int:
        """``n`` tokens: the prompt asks for ``n`` terms, so generation stops there (an
        earlier ``<eos>`` ends it sooner)."""
        return int(prompt[-1])

    def eval_prompts(self) -> list[str]:
        return [
            f"{a},{(a + d) % m}:{m},{n}"
            for m in self.moduli
            for n in self.num_terms
            for a in range(m)
            for d in self._diffs(m)
        ]

    def answer(self, prompt: str) -> str:
        first, rest = prompt.split(":")
        a, b = (int(x) for x in first.split(","))
        m, n = (int(x) for x in rest.split(","))
        d = b - a
        return "".join(str((b + k * d) % m) for k in range(1, n + 1))

    def reward(self, prompt: str, response: str) -> float:
        """Fraction of terms right before the first wrong one, in [0, 1]; 1 iff exact."""
        return _prefix_fraction(list(self.answer(prompt)), list(response))


@dataclass(frozen=True, kw_only=True)
class SumDigitsTask:
    """Sum of digits: ``"d1d2...dL="`` -> ``str(d1 + ... + dL)``.

    Attributes:
        num_digits: L, 1..4 (the evaluation set has 10**L prompts).
    """

    num_digits: int = 2
    name: str = "sum"
    tokenizer: CharTokenizer = field(default=CharTokenizer("0123456789,:="), init=False)

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

    def reward(self, prompt: str, response: str) -> float:
        return _prefix_fraction(list(self.answer(prompt)), list(response))


TASK_NAMES = ("digits", "sum")


def make_task(name: str, **kwargs) -> DigitsTask | SumDigitsTask:
    """The task called ``name`` (``digits`` or ``sum``) with its keyword settings (an
    unknown one is named with those it takes)."""
    classes = {"digits": DigitsTask, "sum": SumDigitsTask}
    if name not in classes:
        raise ValueError(f"unknown task {name!r}; choose one of {', '.join(TASK_NAMES)}")
    check_kwargs(classes[name], kwargs, "task_kwargs")
    return classes[name](**kwargs)
