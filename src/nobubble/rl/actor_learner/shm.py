"""Shared-memory slots between an env worker and central inference.

One :class:`EnvSlot` per env group: ``obs (K, D)`` float32, ``reward (K,)`` float32,
``done (K,)`` bool written by the worker, ``action (K,)`` int64 written by the learner.
The arrays are ``multiprocessing`` raw shared memory, created by the parent and inherited
by (or pickled to) the worker; who may write which array when is the message protocol's
business (:mod:`nobubble.rl.actor_learner.actors`): a side writes only after receiving the
other side's byte, so no lock is needed.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["EnvSlot"]


class EnvSlot:
    """The observation, reward, done and action buffers of ``K`` environments."""

    def __init__(self, mp_context: Any, num_envs: int, obs_dim: int) -> None:
        self.num_envs, self.obs_dim = num_envs, obs_dim
        self._raw = {
            "obs": mp_context.RawArray("f", num_envs * obs_dim),
            "reward": mp_context.RawArray("f", num_envs),
            "done": mp_context.RawArray("b", num_envs),
            "action": mp_context.RawArray("q", num_envs),
        }
        self._views: dict[str, np.ndarray] | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {"num_envs": self.num_envs, "obs_dim": self.obs_dim, "_raw": self._raw}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._views = None

    def _view(self) -> dict[str, np.ndarray]:
        if self._views is None:  # numpy views, made once per process
            dtypes = {"obs": np.float32, "reward": np.float32, "done": np.int8, "action": np.int64}
            self._views = {k: np.frombuffer(v, dtype=dtypes[k]) for k, v in self._raw.items()}
            self._views["obs"] = self._views["obs"].reshape(self.num_envs, self.obs_dim)
        return self._views

    def write_step(self, obs: np.ndarray, reward: np.ndarray, done: np.ndarray) -> None:
        """Worker side: ``obs (K, D)``, ``reward (K,)``, ``done (K,)`` after a step."""
        v = self._view()
        v["obs"][:], v["reward"][:], v["done"][:] = obs, reward, done

    def read_step(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Learner side: copies of ``obs (K, D)``, ``reward (K,)``, ``done (K,)`` bool."""
        v = self._view()
        return v["obs"].copy(), v["reward"].copy(), v["done"].astype(bool)

    def write_actions(self, actions: np.ndarray) -> None:
        """Learner side: ``actions (K,)`` int64."""
        self._view()["action"][:] = actions

    def read_actions(self) -> np.ndarray:
        """Worker side: a copy of ``actions (K,)`` int64."""
        return self._view()["action"].copy()
