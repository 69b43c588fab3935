"""Gymnasium environments for the actors: by id or factory, a step delay (a stand-in for a
slow simulator or a tool call), a vector of them. Truncation (CartPole's 500-step limit) ends
an episode without bootstrap, as cleanrl and most IMPALA implementations do.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import gymnasium
import numpy as np

__all__ = ["StepDelay", "VectorEnv", "VectorStep", "make_env", "env_spaces", "env_label"]


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


@dataclass(frozen=True)
class VectorStep:
    """One step of ``K`` environments: the next ``obs (K, D)`` float32 (the reset one where
    ``done``), ``rewards (K,)`` float32, ``dones (K,)`` bool (terminated or truncated)."""

    obs: np.ndarray
    rewards: np.ndarray
    dones: np.ndarray


class VectorEnv:
    """``K`` environments stepped in turn, each reset as soon as its episode ends (so the
    observation of a finished one is the first of its next episode)."""

    def __init__(
        self, env: str | Callable[[], Any], num_envs: int, seed: int, delay_ms: float = 0.0
    ) -> None:
        if num_envs < 1:
            raise ValueError(f"VectorEnv: num_envs={num_envs} must be >= 1")
        self.envs = [make_env(env, delay_ms) for _ in range(num_envs)]
        self.seed = seed

    @property
    def num_envs(self) -> int:
        return len(self.envs)

    def reset(self) -> np.ndarray:
        """Reset all with seeds ``seed, seed + 1, ...``; ``(K, D)`` float32."""
        obs = [e.reset(seed=self.seed + i)[0] for i, e in enumerate(self.envs)]
        return np.stack(obs).astype(np.float32)  # (K, D)

    def step(self, actions: np.ndarray) -> VectorStep:
        """Step environment ``k`` with ``actions[k]`` (``(K,)`` int)."""
        obs, rewards = [], np.empty(self.num_envs, dtype=np.float32)
        dones = np.zeros(self.num_envs, dtype=bool)
        for k, env in enumerate(self.envs):
            o, rewards[k], terminated, truncated, _ = env.step(int(actions[k]))
            if terminated or truncated:
                dones[k] = True
                o, _ = env.reset()
            obs.append(o)
        return VectorStep(np.stack(obs).astype(np.float32), rewards, dones)

    def close(self) -> None:
        for env in self.envs:
            env.close()
