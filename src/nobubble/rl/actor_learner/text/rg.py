"""A reasoning-gym task played over several turns, with a hint after each wrong answer.

    env:   Calculate 4 + 9.
    model: 10           env: higher
    model: 14           env: lower
    model: 13           env: correct        reward 1, done

The opening message is the question of one of the pool's entries
(:class:`~nobubble.rl.system.tasks.rg.ReasoningGymPool`, the task producer's pool too;
entry ``seed % size`` for an episode drawn from ``seed``); each turn is scored by the
dataset's own verifier, ``score_answer(turn, entry)``. A turn that scores 1 ends the episode
with reward 1. A wrong turn is answered ``higher`` or ``lower`` when both it and the answer
are numbers, else ``wrong``; after ``max_turns`` turns the episode ends with the last turn's
score as the reward (reasoning-gym gives partial credit for some near misses).

The model may say the characters of the dataset's answers (``turn_alphabet``), up to the
longest answer (``max_turn_chars``).
"""

from __future__ import annotations

from typing import Any

from nobubble.rl.actor_learner.text.protocol import TextStep
from nobubble.rl.system.tasks.rg import ReasoningGymPool
from nobubble.validation import check_value

__all__ = ["ReasoningGymEnv"]

HINTS = ("higher", "lower", "wrong", "correct")


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


class ReasoningGymEnv:
    """A reasoning-gym question pool as a multi-turn :class:`TextEnv`.

    Args:
        questions: the pool (made once and shared by every env of a run: generating one
            takes a while; an episode only reads it), or a dataset name to make one from
            ``**pool`` (``size``, ``seed`` and the dataset's config).
        max_turns: answers allowed per question.
    """

    def __init__(
        self, questions: ReasoningGymPool | str, *, max_turns: int = 4, **pool: Any
    ) -> None:
        if isinstance(questions, str):
            questions = ReasoningGymPool(questions, **pool)
        elif pool:
            raise ValueError(f"ReasoningGymEnv: {sorted(pool)} given with a ready pool")
        check_value("max_turns", max_turns, ">= 1", integer=True)
        self.questions, self.max_turns = questions, max_turns
        self.name, self.turn_alphabet = questions.name, questions.answer_chars
        self.max_turn_chars = max(len(a) for a in questions.answers)
        self.alphabet = "".join(sorted(set(questions.chars + "".join(HINTS))))
        self.entry = questions.entries[0]
        self.turns = 0

    def reset(self, seed: int) -> str:
        entries = self.questions.entries
        self.entry, self.turns = entries[seed % len(entries)], 0
        return str(self.entry["question"])

    def step(self, turn: str) -> TextStep:
        self.turns += 1
        score = self.questions.score(self.entry, turn)
        if score >= 1.0:
            return TextStep("correct", 1.0, True)
        last = self.turns >= self.max_turns
        guess, answer = _number(turn), _number(str(self.entry["answer"]))
        if guess is None or answer is None or guess == answer:
            hint = "wrong"
        else:
            hint = "higher" if answer > guess else "lower"
        return TextStep(hint, score if last else 0.0, last)
