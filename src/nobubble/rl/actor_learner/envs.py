"""Gymnasium environments for the actors: by id or factory, a step delay (a stand-in for a
slow simulator or a tool call), a vector of them. Truncation (CartPole's 500-step limit) ends
an episode without bootstrap, as cleanrl and most IMPALA implementations do.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import Any

import gymnasium

from nobubble.validation import check_value

__all__ = ["StepDelay", "make_env", "env_spaces", "env_label", "vector_env"]


class StepDelay(gymnasium.Wrapper):
    """Wrap a gymnasium env so that every ``step`` first sleeps ``delay_ms`` milliseconds."""

    def __init__(self, env: Any, delay_ms: float) -> None:
        super().__init__(env)
        self.delay_s = delay_ms / 1000.0

    def step(self, action: Any) -> Any:
        if self.delay_s > 0:
            time.sleep(self.delay_s)
        return self.env.step(action)


def make_env(env: str | Callable[[], Any], delay_ms: float = 0.0) -> Any:
    """One environment: ``gymnasium.make(env)`` or ``env()``, wrapped in :class:`StepDelay`
    when ``delay_ms > 0``."""
    made = gymnasium.make(env, disable_env_checker=True) if isinstance(env, str) else env()
    return StepDelay(made, delay_ms) if delay_ms > 0 else made


def env_label(env: str | Callable[[], Any]) -> str:
    """A run's name for ``env``: the gymnasium id, else the factory's ``name`` or
    ``__name__`` (``"custom"`` when it has neither)."""
    if isinstance(env, str):
        return env
    return str(getattr(env, "name", None) or getattr(env, "__name__", "custom"))


def env_spaces(env: str | Callable[[], Any]) -> tuple[int, int]:
    """``(obs_dim, num_actions)`` of a flat-Box-observation, Discrete-action environment.

    Raises:
        ValueError: the spaces are not a flat Box and a Discrete (this core's MLP policy).
    """
    probe = make_env(env)
    obs_space, act_space = probe.observation_space, probe.action_space
    probe.close()
    if not isinstance(obs_space, gymnasium.spaces.Box) or len(obs_space.shape) != 1:
        raise ValueError(
            f"env={env!r} has observation space {obs_space}; the MLP actor-critic needs a "
            "flat Box (vector observations): pick such an env or flatten it in a factory"
        )
    if not isinstance(act_space, gymnasium.spaces.Discrete):
        raise ValueError(
            f"env={env!r} has action space {act_space}; the categorical policy needs Discrete"
        )
    return int(obs_space.shape[0]), int(act_space.n)


def vector_env(
    env: str | Callable[[], Any], num_envs: int, delay_ms: float = 0.0
) -> gymnasium.vector.SyncVectorEnv:
    """``num_envs`` environments of :func:`make_env` stepped in turn, each reset in the step
    its episode ends (``SAME_STEP``: the observation of a finished one is the first of its
    next episode; ``terminated | truncated`` marks the end); ``reset(seed=s)`` seeds them
    ``s, s + 1, ...``.

    Raises:
        ValueError: ``num_envs < 1``.
    """
    check_value("vector_env: num_envs", num_envs, ">= 1", integer=True)
    make = functools.partial(make_env, env, delay_ms)
    same_step = gymnasium.vector.AutoresetMode.SAME_STEP
    return gymnasium.vector.SyncVectorEnv([make] * num_envs, autoreset_mode=same_step)
