"""The built-in text environment: guess the number, told "higher" or "lower" after each miss.

    env:   guess 1-7
    model: 4            env: lower
    model: 2            env: higher
    model: 3            env: correct        reward 1, done

A turn is a number in decimal (``max_turn_chars`` digits). A miss is answered ``higher``
(the secret is higher than the guess) or ``lower``; a turn that is not a number in range is
answered ``?`` and costs a turn too. The episode ends on the hit (reward 1) or after
``max_turns`` turns (reward 0), so the return is the success.

The figures to judge a learner by (:func:`guess_number_odds`): a policy that guesses a
uniformly random number each turn succeeds with ``1 - (1 - 1/high)^T``; the best policy that
ignores the replies with ``min(T, high) / high``; binary search with ``min(1, (2^T - 1) /
high)``. With the defaults (1-7, 3 turns): 0.37, 0.43 and 1.0 - a success rate of 0.8
needs the feedback.
"""

from __future__ import annotations

import random
import string
from dataclasses import dataclass

from nobubble.rl.actor_learner.text.protocol import TextStep
from nobubble.validation import check_value

__all__ = ["GuessNumber", "GuessOdds", "guess_number_odds"]

HIGHER, LOWER, CORRECT, INVALID = "higher", "lower", "correct", "?"


class GuessNumber:
    """Guess a secret in ``1..high`` within ``max_turns`` turns (a :class:`TextEnv`)."""

    turn_alphabet = string.digits

    def __init__(self, high: int = 7, max_turns: int = 3) -> None:
        if not isinstance(high, int) or high < 2:
            raise ValueError(f"GuessNumber: high={high!r} must be an integer >= 2")
        check_value("GuessNumber: max_turns", max_turns, ">= 1", integer=True)
        self.high, self.max_turns = high, max_turns
        self.max_turn_chars = len(str(high))
        words = f"guess 1-{high}{HIGHER}{LOWER}{CORRECT}{INVALID}"
        self.alphabet = "".join(sorted(set(words) | set(string.digits)))
        self.secret, self.turns = 0, 0

    def reset(self, seed: int) -> str:
        self.secret, self.turns = random.Random(seed).randint(1, self.high), 0
        return f"guess 1-{self.high}"

    def step(self, turn: str) -> TextStep:
        self.turns += 1
        last = self.turns >= self.max_turns
        if not turn.isdigit() or not 1 <= int(turn) <= self.high:
            return TextStep(INVALID, 0.0, last)
        guess = int(turn)
        if guess == self.secret:
            return TextStep(CORRECT, 1.0, True)
        return TextStep(HIGHER if self.secret > guess else LOWER, 0.0, last)


@dataclass(frozen=True)
class GuessOdds:
    """Success rates of reference policies on :class:`GuessNumber`.

    Attributes:
        random_guess: a uniformly random number in range every turn.
        blind_best: the best fixed sequence of guesses (ignores the replies).
        binary_search: the best policy.
    """

    random_guess: float
    blind_best: float
    binary_search: float


def guess_number_odds(high: int, max_turns: int) -> GuessOdds:
    """The reference success rates for secrets in ``1..high`` and ``max_turns`` turns."""
    return GuessOdds(
        random_guess=1.0 - (1.0 - 1.0 / high) ** max_turns,
        blind_best=min(max_turns, high) / high,
        binary_search=min(1.0, (2**max_turns - 1) / high),
    )
