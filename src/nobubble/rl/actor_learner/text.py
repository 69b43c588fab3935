"""Multi-turn text environments (``docs/rl/actor-learner.md``): the :class:`TextEnv` protocol,
its token-level gymnasium form :class:`TokenEnv`, the built-ins, the character-transformer
policy and :func:`text_run_config` (``train(text_run_config(MyTextEnv))``). Legend: ``N``
observations, ``L`` window, ``V`` vocabulary, ``A`` actions.
"""

from __future__ import annotations

import functools
import random
import string
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from typing import Any, Protocol

import gymnasium
import numpy as np
import torch
from torch import nn

from nobubble.rl.actor_learner.config import EnvRunConfig
from nobubble.rl.system.policies import CharTransformer, PolicyConfig
from nobubble.rl.system.tasks import CharTokenizer, ReasoningGymPool, as_reward
from nobubble.validation import check_value

__all__ = [
    "GuessNumber",
    "GuessOdds",
    "ReasoningGymEnv",
    "TEXT_DEFAULTS",
    "TextActorCritic",
    "TextEnv",
    "TextPolicyConfig",
    "TextStep",
    "TokenEnv",
    "check_text_env",
    "guess_number_odds",
    "is_text_env",
    "text_env_config",
    "text_run_config",
]

END_OF_TURN = 0  # the action that ends a turn: token <eos>, and action a is token <eos> + a
HIGHER, LOWER, CORRECT, WRONG, INVALID = "higher", "lower", "correct", "wrong", "?"


@dataclass(frozen=True)
class TextStep:
    """The env's answer to one turn: its ``reply`` (characters of its ``alphabet``, may be
    empty), the ``reward`` the turn earned (any finite real), and ``done``: the episode ended."""

    reply: str
    reward: float
    done: bool


class TextEnv(Protocol):
    """A multi-turn text environment (any object with these members): ``alphabet``, every
    character the opening message and the replies may hold; ``turn_alphabet``, the characters
    the model may say (its actions, without end-of-turn); ``max_turn_chars``, the longest turn
    (a turn also ends when it reaches this many characters)."""

    alphabet: str
    turn_alphabet: str
    max_turn_chars: int

    def reset(self, seed: int) -> str:
        """Start an episode drawn from ``seed``; the opening message."""

    def step(self, turn: str) -> TextStep:
        """The model said ``turn`` (characters of ``turn_alphabet``, possibly empty)."""


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


class TokenEnv(gymnasium.Env):
    """``env`` (a :class:`TextEnv`) one token of the model's turn per step. Action 0 ends the
    turn (``<eos>``), action ``a >= 1`` says ``turn_alphabet[a - 1]`` (token ``<eos> + a``); a
    turn also ends at ``max_turn_chars``, and the env's reply and the turn's reward come on
    that step. The observation is the last ``max_len`` tokens, right-aligned and left-padded
    with ``<pad>``, float32 ``(L,)``; an episode longer than ``max_episode_steps`` tokens is
    truncated. ``transcript``: the episode as ``("env" | "model", text)`` messages, in order."""

    def __init__(self, env: TextEnv, max_len: int, max_episode_steps: int = 1024) -> None:
        check_text_env(env)
        if max_len < 2 or max_episode_steps < 1:
            raise ValueError(
                f"TokenEnv: max_len={max_len} must be >= 2 and max_episode_steps="
                f"{max_episode_steps} >= 1"
            )
        self.text_env, self.max_len, self.max_episode_steps = env, max_len, max_episode_steps
        rest = "".join(sorted(set(env.alphabet) - set(env.turn_alphabet)))
        self.tokenizer = CharTokenizer(env.turn_alphabet + rest)  # <pad> <bos> <eos>, turn, rest
        self.num_actions = 1 + len(env.turn_alphabet)  # A: end-of-turn, one per turn character
        top = float(self.tokenizer.vocab_size - 1)
        self.observation_space = gymnasium.spaces.Box(0.0, top, (max_len,), np.float32)
        self.action_space = gymnasium.spaces.Discrete(self.num_actions)
        self.tokens: list[int] = []
        self.transcript: list[tuple[str, str]] = []
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
    """A zero-argument factory of :class:`TokenEnv` (what ``EnvRunConfig.env`` takes) over
    ``make``, a zero-argument factory of the text env (picklable unless the start method is
    ``fork``); ``max_len``: the window L in tokens; ``name``: the run's name for the env."""

    make: Callable[[], Any]
    max_len: int
    name: str
    max_episode_steps: int = 1024

    def __call__(self) -> TokenEnv:
        return TokenEnv(self.make(), self.max_len, self.max_episode_steps)


class GuessNumber:
    """Guess a secret in ``1..high`` within ``max_turns`` turns (a :class:`TextEnv`): a turn
    is a number in decimal; a miss is answered ``higher`` (the secret is higher) or ``lower``,
    a turn that is not a number in range ``?`` (it costs a turn too). The episode ends on the
    hit (reward 1) or after ``max_turns`` turns (reward 0): the return is the success."""

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
    """Success rates on :class:`GuessNumber` of a uniformly random guess every turn
    (``random_guess``), the best fixed sequence of guesses (``blind_best``, it ignores the
    replies) and binary search (``binary_search``, the best policy)."""

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


class ReasoningGymEnv:
    """The questions of a reasoning-gym pool (made once and shared by every env of a run) as
    a multi-turn :class:`TextEnv` with hints: the opening is the question of entry ``seed %
    size``, each turn is scored by the dataset's verifier; a score of 1 ends the episode with
    reward 1, a miss is answered ``higher`` / ``lower`` when it and the answer are numbers,
    else ``wrong``; after ``max_turns`` turns the last turn's score (partial credit) is the
    reward. The model may say the characters of the dataset's answers, up to the longest."""

    def __init__(self, questions: ReasoningGymPool, *, max_turns: int = 4) -> None:
        check_value("max_turns", max_turns, ">= 1", integer=True)
        self.questions, self.max_turns = questions, max_turns
        self.name, self.turn_alphabet = questions.name, questions.answer_chars
        self.max_turn_chars = max(len(a) for a in questions.answers)
        hints = HIGHER + LOWER + WRONG + CORRECT
        self.alphabet = "".join(sorted(set(questions.chars + hints)))
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
            return TextStep(CORRECT, 1.0, True)
        last = self.turns >= self.max_turns
        try:
            guess, answer = float(turn), float(str(self.entry["answer"]))
        except ValueError:
            guess = answer = 0.0  # not both numbers: no direction to hint
        if guess == answer:
            hint = WRONG
        else:
            hint = HIGHER if answer > guess else LOWER
        return TextStep(hint, score if last else 0.0, last)


@dataclass(frozen=True, kw_only=True)
class TextPolicyConfig:
    """Shape of the character transformer: :class:`PolicyConfig`'s fields that the env does
    not fix (the vocabulary and the window do); checked as a :class:`PolicyConfig` by
    :func:`text_run_config`."""

    hidden: int = 16
    num_layers: int = 1
    num_heads: int = 2


class TextActorCritic(nn.Module):
    """``obs (..., L) -> (logits (..., A), value (...))`` from a :class:`CharTransformer`
    (``config``, its ``max_seq_len`` set to ``obs_dim`` = L; its ``vocab_size`` V the env's)
    run for the newest token only (the left padding is a token, not masked: the fast causal
    path; no KV cache, so a step is a function of its observation). Action ``a`` is token
    ``first_action_id + a``. With ``config`` and ``first_action_id`` bound
    (``functools.partial``) it is the factory ``EnvRunConfig.model`` takes."""

    def __init__(
        self, obs_dim: int, num_actions: int, *, config: PolicyConfig, first_action_id: int
    ) -> None:
        super().__init__()
        if first_action_id + num_actions > config.vocab_size:
            raise ValueError(
                f"TextActorCritic: actions {first_action_id}..{first_action_id + num_actions - 1}"
                f" do not fit the vocabulary of {config.vocab_size} tokens"
            )
        self.obs_dim, self.num_actions = obs_dim, num_actions
        self.first_action_id = first_action_id
        self.lm = CharTransformer(replace(config, max_seq_len=obs_dim))

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        lead = obs.shape[:-1]
        tokens = obs.reshape(-1, self.obs_dim).long()  # (N, L)
        logits, values = self.lm(tokens, last_only=True)  # (N, V), (N,)
        a0 = self.first_action_id
        logits = logits[:, a0 : a0 + self.num_actions]  # (N, A): the next token, sayable ones
        return logits.reshape(*lead, self.num_actions), values.reshape(lead)

    def policy(self, obs: torch.Tensor) -> torch.Tensor:
        """``obs (N, L) -> logits (N, A)``."""
        return self.forward(obs)[0]


TEXT_DEFAULTS: dict[str, Any] = {
    "arch": "seed",  # batched central inference: no transformer copy per actor
    "actors": 2,
    "envs_per_actor": 16,
    "unroll_length": 16,
    "batch_trajectories": 2,
    "epochs": 2,
    "minibatches": 2,
    "lr": 2e-3,
    "entropy_coef": 0.01,
    "gamma": 0.99,
    "target_return": 0.8,
    "eval_episodes": 100,
    "eval_every_s": 3.0,
    "time_budget_s": 120.0,
}
"""What :func:`text_run_config` sets unless told otherwise."""


def text_run_config(
    env: Callable[[], Any],
    *,
    max_len: int = 64,
    name: str | None = None,
    policy: TextPolicyConfig | None = None,
    **run: Any,
) -> EnvRunConfig:
    """An actor-learner run on the text env that ``env()`` makes (``env``: a zero-argument
    factory of a :class:`TextEnv`, picklable unless the start method is ``fork``), with the
    policy's window of ``max_len`` tokens (older ones drop out), ``name`` for the env
    (default: the factory's ``__name__``), the transformer's shape ``policy`` and any
    :class:`EnvRunConfig` field in ``run`` (over :data:`TEXT_DEFAULTS`); ``ValueError`` when
    ``env()`` is not a text env or a field is bad."""
    label = name or getattr(env, "__name__", None) or type(env).__name__
    factory = TextEnvFactory(env, max_len, label)
    tokenizer = factory().tokenizer  # one env made here, to read its alphabets
    shape = asdict(policy or TextPolicyConfig())
    config = PolicyConfig(vocab_size=tokenizer.vocab_size, max_seq_len=max_len, **shape)
    model = functools.partial(  # action 0 is <eos>
        TextActorCritic, config=config, first_action_id=tokenizer.eos_id
    )
    return EnvRunConfig(**{**TEXT_DEFAULTS, **run, "env": factory, "model": model})


def is_text_env(name: str) -> bool:
    """True for the built-in text env names (``guess-number``, ``rg:<task>``)."""
    return name == "guess-number" or name.startswith("rg:")


def text_env_config(name: str, options: dict[str, Any] | None = None, **run: Any) -> EnvRunConfig:
    """The run on a built-in text env: ``guess-number`` (:class:`GuessNumber`; options
    ``high``, ``max_turns``) or ``rg:<task>`` (:class:`ReasoningGymEnv`; options
    ``max_turns``, ``size``, ``seed`` and the dataset's config); ``ValueError`` naming an
    unknown name or option."""
    options = dict(options or {})
    if name == "guess-number":
        guess = functools.partial(GuessNumber, **options)
        try:
            guess()  # check the options here, not in every actor
        except TypeError as err:
            raise ValueError(f"--env guess-number: {err}; options: high, max_turns") from None
        return text_run_config(guess, max_len=48, name=name, **run)
    if name.startswith("rg:"):
        turns = {"max_turns": options.pop("max_turns")} if "max_turns" in options else {}
        questions = ReasoningGymPool(name[3:], **options)  # one pool for every env
        make = functools.partial(ReasoningGymEnv, questions, **turns)
        return text_run_config(make, max_len=80, name=name, **run)
    raise ValueError(f"env={name!r} is not a text env; use guess-number or rg:<task>")
