"""The multi-turn text environment protocol: the model speaks a turn, the environment replies.

An episode, as the environment sees it::

    opening = env.reset(seed)                       # the first message, e.g. "guess 1-7"
    until done:
        reply, reward, done = env.step(turn)        # the model's turn -> TextStep

The reward of a step is what that turn earned: typically 0 until the last turn, then 1 for a
success. The environment ends the episode itself (``done``), at the latest after its own
turn budget. It also declares its characters, which fix the policy's vocabulary:

- ``alphabet``: every character its messages (opening and replies) may hold;
- ``turn_alphabet``: the characters the model may say; the model's actions are these plus
  end-of-turn;
- ``max_turn_chars``: the longest turn; a turn ends at end-of-turn or at this length.

:func:`check_text_env` refuses an object that misses any of it, naming what is missing.
:class:`~nobubble.rl.actor_learner.text.tokens.TokenEnv` turns such an environment into a
token-level gymnasium env, so every architecture of the core runs it unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from nobubble.validation import check_value

__all__ = ["TextEnv", "TextStep", "check_text_env"]


@dataclass(frozen=True)
class TextStep:
    """The environment's answer to one turn.

    Attributes:
        reply: the environment's message (characters of its ``alphabet``; may be empty).
        reward: what the turn earned (any finite real).
        done: the episode ended with this turn.
    """

    reply: str
    reward: float
    done: bool


class TextEnv(Protocol):
    """A multi-turn text environment (any object with these attributes and methods)."""

    alphabet: str
    """Every character the opening message and the replies may hold."""
    turn_alphabet: str
    """The characters the model may say (its action vocabulary, without end-of-turn)."""
    max_turn_chars: int
    """The longest turn: a turn also ends when it reaches this many characters."""

    def reset(self, seed: int) -> str:
        """Start an episode drawn from ``seed``; the opening message."""
        ...

    def step(self, turn: str) -> TextStep:
        """The model said ``turn`` (characters of ``turn_alphabet``, possibly empty)."""
        ...


def check_text_env(env: Any) -> None:
    """Raise ``ValueError`` naming what ``env`` lacks to be a :class:`TextEnv`."""
    name = type(env).__name__
    missing = [a for a in ("reset", "step") if not callable(getattr(env, a, None))]
    missing += [a for a in ("alphabet", "turn_alphabet", "max_turn_chars") if not hasattr(env, a)]
    if missing:
        raise ValueError(
            f"text env {name} has no {', '.join(missing)}; a text env needs reset(seed) -> str, "
            "step(turn) -> TextStep, alphabet, turn_alphabet and max_turn_chars"
        )
    if not isinstance(env.turn_alphabet, str) or not env.turn_alphabet:
        raise ValueError(f"text env {name}: turn_alphabet={env.turn_alphabet!r} must be a str")
    if len(set(env.turn_alphabet)) != len(env.turn_alphabet):
        raise ValueError(f"text env {name}: turn_alphabet={env.turn_alphabet!r} repeats a char")
    check_value(f"text env {name}: max_turn_chars", env.max_turn_chars, ">= 1", integer=True)
