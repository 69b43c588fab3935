"""Runs on text environments: a text env in, an :class:`EnvRunConfig` out, and the names.

:func:`text_run_config` wraps a text env factory into the core's two hooks - the env
(:class:`~.tokens.TextEnvFactory`, token-level gymnasium envs) and the model
(:class:`~.policy.TextPolicyFactory`, the character transformer over the env's vocabulary) -
with defaults that suit short conversations; ``train`` then runs it under any architecture.
For a text env whose return is its success (guess the number), ``eval_mean_return`` is the
greedy success rate and ``target_return`` a success rate.

:func:`text_env_config` resolves the built-in names the command line takes:
``guess-number`` and ``rg:<task>`` (a reasoning-gym task over several turns).
:func:`policy_success` measures a policy's sampled success rate, e.g. the untrained one's.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch

from nobubble.rl.actor_learner.config import EnvRunConfig
from nobubble.rl.actor_learner.envs import VectorEnv
from nobubble.rl.actor_learner.model import PolicyModel, initial_model
from nobubble.rl.actor_learner.rollout import evaluate
from nobubble.rl.actor_learner.text.guess_number import GuessNumber
from nobubble.rl.actor_learner.text.policy import TextPolicyConfig, TextPolicyFactory
from nobubble.rl.actor_learner.text.tokens import TextEnvFactory

__all__ = [
    "TEXT_DEFAULTS",
    "TEXT_ENV_NAMES",
    "text_run_config",
    "text_env_config",
    "is_text_env",
    "policy_success",
]

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
        env: a zero-argument factory of a :class:`~.protocol.TextEnv` (its class, or a
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
    ``high``, ``max_turns``) or ``rg:<task>`` (:class:`~.rg.ReasoningGymEnv`; options
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
        from nobubble.rl.actor_learner.text.rg import ReasoningGymEnv
        from nobubble.rl.system.tasks.rg import ReasoningGymPool

        turns = {"max_turns": options.pop("max_turns")} if "max_turns" in options else {}
        questions = ReasoningGymPool(name[3:], **options)  # one pool for every env
        make = functools.partial(ReasoningGymEnv, questions, **turns)
        return text_run_config(make, max_len=80, name=name, **run)
    raise ValueError(f"env={name!r} is not a text env; use one of {TEXT_ENV_NAMES}")


def policy_success(
    config: EnvRunConfig,
    model: PolicyModel | None = None,
    *,
    episodes: int = 200,
    seed: int = 12_345,
    greedy: bool = False,
) -> float:
    """Mean return of ``episodes`` episodes of ``config.env`` (its success rate when the
    return is the success), actions sampled (or greedy) from ``model``.

    ``model`` None: the untrained model ``train(config)`` starts from (same seed, same
    initialisation), i.e. the success rate a run starts at.
    """
    model = initial_model(config) if model is None else model
    envs = VectorEnv(config.env, episodes, seed)
    generator = None if greedy else torch.Generator().manual_seed(seed)
    returns = evaluate(model, envs, episodes, generator=generator)
    envs.close()
    return sum(returns) / len(returns)
