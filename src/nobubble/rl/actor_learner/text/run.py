"""Runs on text environments: the character-transformer policy, a text env in and an
:class:`EnvRunConfig` out, and the built-in names (``guess-number``, ``rg:<task>``). For a
text env whose return is its success, ``evaluate`` gives a policy's success rate.

Legend: ``N`` observations, ``L`` window, ``V`` vocabulary, ``A`` actions.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from typing import Any

import torch
from torch import nn

from nobubble.rl.actor_learner.config import EnvRunConfig
from nobubble.rl.actor_learner.text.envs import GuessNumber, ReasoningGymEnv, TextEnvFactory
from nobubble.rl.system.policies import CharTransformer, PolicyConfig
from nobubble.rl.system.tasks import ReasoningGymPool

__all__ = [
    "TEXT_DEFAULTS",
    "TEXT_ENV_NAMES",
    "TextActorCritic",
    "TextPolicyConfig",
    "TextPolicyFactory",
    "is_text_env",
    "text_env_config",
    "text_run_config",
]


@dataclass(frozen=True, kw_only=True)
class TextPolicyConfig:
    """Shape of the character transformer: :class:`PolicyConfig`'s fields that the env does
    not fix (the vocabulary and the window do); checked as a :class:`PolicyConfig` when
    :meth:`for_env` makes one."""

    hidden: int = 16
    num_layers: int = 1
    num_heads: int = 2

    def for_env(self, vocab_size: int, max_len: int) -> PolicyConfig:
        """The transformer for ``vocab_size`` tokens and a window of ``max_len``."""
        return PolicyConfig(vocab_size=vocab_size, max_seq_len=max_len, **asdict(self))


class TextActorCritic(nn.Module):
    """``obs (..., L) -> (logits (..., A), value (...))`` from a :class:`CharTransformer`
    read at the newest token (position ``L - 1``: the left padding is a token of its own, not
    masked, so the batch takes the transformer's fast causal path). ``last_only=True`` runs
    the last block for that one query: the same numbers as ``forward(...)[:, -1]``, a third
    of the cost. No KV cache: a step is a pure function of its observation.

    Args:
        config: the transformer: V, its ``vocab_size``, is the env's vocabulary; L, its
            ``max_seq_len``, the observation window (``obs_dim``).
        num_actions: A; action ``a`` is token ``first_action_id + a``.
        first_action_id: the token of action 0.
    """

    def __init__(self, config: PolicyConfig, num_actions: int, first_action_id: int) -> None:
        super().__init__()
        if first_action_id + num_actions > config.vocab_size:
            raise ValueError(
                f"TextActorCritic: actions {first_action_id}..{first_action_id + num_actions - 1}"
                f" do not fit the vocabulary of {config.vocab_size} tokens"
            )
        self.obs_dim, self.num_actions = config.max_seq_len, num_actions
        self.first_action_id = first_action_id
        self.lm = CharTransformer(config)

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


@dataclass(frozen=True)
class TextPolicyFactory:
    """``(obs_dim, num_actions) -> TextActorCritic``: what ``EnvRunConfig.model`` takes
    (``obs_dim`` is the window ``config.max_seq_len``)."""

    config: PolicyConfig
    first_action_id: int

    def __call__(self, obs_dim: int, num_actions: int) -> TextActorCritic:
        return TextActorCritic(
            replace(self.config, max_seq_len=obs_dim), num_actions, self.first_action_id
        )


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

TEXT_ENV_NAMES: tuple[str, ...] = ("guess-number", "rg:<task>")


def text_run_config(
    env: Callable[[], Any],
    *,
    max_len: int = 64,
    name: str | None = None,
    policy: TextPolicyConfig | None = None,
    **run: Any,
) -> EnvRunConfig:
    """An actor-learner run on the text env that ``env()`` makes.

    Args:
        env: a zero-argument factory of a :class:`~.envs.TextEnv` (its class, or a
            ``functools.partial``); picklable unless the start method is ``fork``.
        max_len: the policy's window in tokens (older tokens of a long conversation drop out).
        name: the run's name for the env (default: the factory's ``__name__``).
        policy: the character transformer's shape.
        **run: any :class:`EnvRunConfig` field, over :data:`TEXT_DEFAULTS`.
    Raises:
        ValueError: ``env()`` is not a text env, or a field is bad.
    """
    label = name or getattr(env, "__name__", None) or type(env).__name__
    factory = TextEnvFactory(env, max_len, label)
    tokenizer = factory().tokenizer  # one env made here, to read its alphabets
    shape = (policy or TextPolicyConfig()).for_env(tokenizer.vocab_size, max_len)
    model = TextPolicyFactory(shape, first_action_id=tokenizer.eos_id)  # action 0 is <eos>
    return EnvRunConfig(**{**TEXT_DEFAULTS, **run, "env": factory, "model": model})


def is_text_env(name: str) -> bool:
    """True for the built-in text env names (``guess-number``, ``rg:<task>``)."""
    return name == "guess-number" or name.startswith("rg:")


def text_env_config(name: str, options: dict[str, Any] | None = None, **run: Any) -> EnvRunConfig:
    """The run on a built-in text env: ``guess-number`` (:class:`GuessNumber`; options
    ``high``, ``max_turns``) or ``rg:<task>`` (:class:`ReasoningGymEnv`; options
    ``max_turns``, ``size``, ``seed`` and the dataset's config).

    Raises:
        ValueError: an unknown name or option (the message names it).
    """
    options = dict(options or {})
    if name == "guess-number":
        try:
            GuessNumber(**options)  # check the options here, not in every actor
        except TypeError as err:
            raise ValueError(f"--env guess-number: {err}; options: high, max_turns") from None
        return text_run_config(
            functools.partial(GuessNumber, **options), max_len=48, name=name, **run
        )
    if name.startswith("rg:"):
        turns = {"max_turns": options.pop("max_turns")} if "max_turns" in options else {}
        questions = ReasoningGymPool(name[3:], **options)  # one pool for every env
        make = functools.partial(ReasoningGymEnv, questions, **turns)
        return text_run_config(make, max_len=80, name=name, **run)
    raise ValueError(f"env={name!r} is not a text env; use one of {TEXT_ENV_NAMES}")
