"""A user-written RL task: "bring your own task" in one file, with no nobubble imports.

:class:`ReverseTask` asks for the letters of the prompt in reverse: ``"abc="`` -> ``"cba"``.
Its reward is dense (the correct prefix of the answer), so a small policy has a gradient to
climb from the start, and its prompt space is small enough (8**3 = 512 with the defaults) to
evaluate exactly rather than on a sample.

Token ids, shared by every framework that runs this task (nobubble's character tokenizer and
the Hugging Face tokenizer of ``benchmarks/rl_vs_trl.py``)::

    0 = <pad>, 1 = <bos>, 2 = <eos>, 3.. = the characters of ``tokenizer_alphabet`` in order

and a prompt is encoded as ``<bos>`` followed by its characters.

Point a runner at it as ``benchmarks/rl_tasks.py:reverse3`` (the task) or
``benchmarks/rl_tasks.py:reverse_reward`` (just the reward function).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

__all__ = ["ReverseTask", "reverse3", "reverse_reward", "prefix_reward"]

SEP = "="  # ends every prompt: "abc="


def prefix_reward(answer: str, response: str) -> float:
    """Fraction of ``answer``'s characters that ``response`` gets right before its first wrong
    one, in [0, 1]; 1 iff ``response == answer``. A response longer than the answer is wrong
    past the answer's end, so it loses the last point (``"cbax"`` scores 2/3 for ``"cba"``)."""
    right = 0
    for want, got in zip(answer, response):
        if want != got:
            break
        right += 1
    if right == len(answer) and len(response) > len(answer):
        right -= 1
    return right / len(answer)


@dataclass(frozen=True, kw_only=True)
class ReverseTask:
    """Reverse ``length`` letters: ``"abc="`` -> ``"cba"``.

    Attributes:
        length: letters per prompt; the evaluation set has ``len(alphabet) ** length`` prompts.
        alphabet: the letters prompts draw from. Kept small (8 by default) so that a width-64
            policy learns the task in a few hundred steps.
        name: the task's name in logs and results.
    """

    length: int = 3
    alphabet: str = "abcdefgh"
    name: str = "reverse"

    def __post_init__(self) -> None:
        if self.length < 1:
            raise ValueError(f"length={self.length} must be at least 1")
        if not self.alphabet or len(set(self.alphabet)) != len(self.alphabet):
            raise ValueError(f"alphabet {self.alphabet!r} must be non-empty with no repeats")
        if SEP in self.alphabet:
            raise ValueError(f"alphabet {self.alphabet!r} must not hold the separator {SEP!r}")

    @property
    def tokenizer_alphabet(self) -> str:
        """The characters a tokenizer needs, ids 3.. in this order (see the module docstring)."""
        return self.alphabet + SEP

    @property
    def max_new_tokens(self) -> int:
        """Room for the answer and its ``<eos>``."""
        return self.length + 1

    def prompts(self) -> list[str]:
        """Every ``length``-letter string over ``alphabet``, lexicographic, as ``"abc="``."""
        return [
            "".join(letters) + SEP
            for letters in itertools.product(self.alphabet, repeat=self.length)
        ]

    def eval_prompts(self) -> list[str]:
        """The whole prompt space: accuracy is exact match over all of it, not a sample."""
        return self.prompts()

    def answer(self, prompt: str) -> str:
        return prompt.removesuffix(SEP)[::-1]

    def reward(self, prompt: str, response: str) -> float:
        """The correct prefix of the answer, in [0, 1] (see :func:`prefix_reward`)."""
        return prefix_reward(self.answer(prompt), response)

    def is_correct(self, prompt: str, response: str) -> bool:
        return response == self.answer(prompt)


reverse3 = ReverseTask()


def reverse_reward(prompt: str, response: str) -> float:
    """:meth:`ReverseTask.reward` as a plain function, for ``--reward module:fn``."""
    return reverse3.reward(prompt, response)
