"""A multi-turn text environment as a token-level gymnasium environment.

The conversation is one token stream in the RL system's character vocabulary
(:class:`~nobubble.rl.system.tasks.builtin.CharTokenizer`: ``<pad>`` 0, ``<bos>`` 1,
``<eos>`` 2, then the characters)::

    <bos> g u e s s   1 - 7 <eos> | 4 <eos> | <bos> h i g h e r <eos> | 6 <eos> | ...
         the opening message        a turn       the env's reply         a turn

Each gymnasium step is one token of the model's turn: action 0 ends the turn (``<eos>``),
action ``a >= 1`` says ``turn_alphabet[a - 1]``. A turn also ends when it reaches
``max_turn_chars``; the text env then answers, its reply is appended and the reward is
the turn's. Every message ends with ``<eos>`` and the env's begin with ``<bos>``, so the
model can always tell where its own turn began. :attr:`TokenEnv.transcript` keeps the
episode as text, speaker by speaker. The turn characters come first in the vocabulary, so action ``a`` is token
``2 + a`` and the policy's actions are one contiguous slice of its next-token logits.

The observation is the last ``max_len`` tokens, right-aligned and left-padded with
``<pad>`` (float32, as the core's shared-memory slots carry them): the newest token is always
at position ``max_len - 1``. Episodes longer than ``max_episode_steps`` tokens are truncated.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import gymnasium
import numpy as np

from nobubble.rl.actor_learner.text.protocol import TextEnv, check_text_env
from nobubble.rl.system.tasks.builtin import CharTokenizer
from nobubble.rl.system.tasks.spec import as_reward

__all__ = ["END_OF_TURN", "TokenEnv", "TextEnvFactory"]

END_OF_TURN = 0  # the action that ends a turn: token <eos>, and action a is token <eos> + a


class TokenEnv(gymnasium.Env):
    """``env`` (a :class:`TextEnv`) one token per step; see the module docstring.

    Attributes:
        tokenizer: ``<pad>`` 0, ``<bos>`` 1, ``<eos>`` 2, ``turn_alphabet``, the other chars.
        num_actions: A, end-of-turn plus one per turn character.
    """

    metadata: dict[str, Any] = {"render_modes": []}

    def __init__(self, env: TextEnv, max_len: int, max_episode_steps: int = 1024) -> None:
        check_text_env(env)
        if max_len < 2 or max_episode_steps < 1:
            raise ValueError(
                f"TokenEnv: max_len={max_len} must be >= 2 and max_episode_steps="
                f"{max_episode_steps} >= 1"
            )
        self.text_env, self.max_len, self.max_episode_steps = env, max_len, max_episode_steps
        rest = "".join(sorted(set(env.alphabet) - set(env.turn_alphabet)))
        self.tokenizer = CharTokenizer(env.turn_alphabet + rest)
        self.num_actions = 1 + len(env.turn_alphabet)
        top = float(self.tokenizer.vocab_size - 1)
        self.observation_space = gymnasium.spaces.Box(0.0, top, (max_len,), np.float32)
        self.action_space = gymnasium.spaces.Discrete(self.num_actions)
        self.tokens: list[int] = []
        self.transcript: list[tuple[str, str]] = []  # ("env" | "model", text), in order
        self._turn: list[str] = []
        self._steps = 0

    def _obs(self) -> np.ndarray:
        obs = np.zeros(self.max_len, dtype=np.float32)  # (L,), <pad> = 0 on the left
        tail = self.tokens[-self.max_len :]
        obs[self.max_len - len(tail) :] = tail
        return obs

    def _message(self, text: str) -> None:
        self.tokens.extend(self.tokenizer.encode(text))  # <bos> and the characters
        self.tokens.append(self.tokenizer.eos_id)
        self.transcript.append(("env", text))

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        super().reset(seed=seed)
        self.tokens, self.transcript, self._turn, self._steps = [], [], [], 0
        self._message(self.text_env.reset(int(self.np_random.integers(2**31))))
        return self._obs(), {}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        a = int(action)
        if not 0 <= a < self.num_actions:
            raise ValueError(f"TokenEnv: action {a} is outside [0, {self.num_actions})")
        self._steps += 1
        reward, done = 0.0, False
        if a != END_OF_TURN:
            self._turn.append(self.text_env.turn_alphabet[a - 1])
            self.tokens.append(self.tokenizer.eos_id + a)
        if a == END_OF_TURN or len(self._turn) >= self.text_env.max_turn_chars:
            self.tokens.append(self.tokenizer.eos_id)
            turn, self._turn = "".join(self._turn), []
            self.transcript.append(("model", turn))
            answer = self.text_env.step(turn)
            self._message(answer.reply)
            name = type(self.text_env).__name__
            reward = as_reward(answer.reward, f"text env {name} for turn {turn!r}")
            done = bool(answer.done)
        truncated = not done and self._steps >= self.max_episode_steps
        return self._obs(), reward, done, truncated, {}


@dataclass(frozen=True)
class TextEnvFactory:
    """A zero-argument factory of :class:`TokenEnv`: what ``EnvRunConfig.env`` takes.

    Attributes:
        make: a zero-argument factory of the text env (a class, or any picklable callable
            unless the start method is ``fork``).
        max_len: L, the observation window in tokens (the longest conversation fits in it,
            or the oldest tokens fall out).
        name: the run's name for the env.
    """

    make: Callable[[], Any]
    max_len: int
    name: str
    max_episode_steps: int = 1024

    def __call__(self) -> TokenEnv:
        return TokenEnv(self.make(), self.max_len, self.max_episode_steps)
