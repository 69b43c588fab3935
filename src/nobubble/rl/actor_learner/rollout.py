"""Rollouts with a local policy: an IMPALA actor's unroll, and the (greedy) evaluation."""

from __future__ import annotations

import numpy as np
import torch

from nobubble.rl.actor_learner.envs import VectorEnv
from nobubble.rl.actor_learner.model import PolicyModel, act
from nobubble.rl.actor_learner.trajectory import Trajectory

__all__ = ["rollout", "evaluate"]


def rollout(
    model: PolicyModel,
    envs: VectorEnv,
    obs: np.ndarray,
    unroll_length: int,
    *,
    version: int,
    generator: torch.Generator,
    source: str,
    seq: int,
    digest: str = "",
) -> tuple[Trajectory, np.ndarray]:
    """``T`` steps of ``K`` envs from ``obs (K, D)`` with ``model`` (policy ``version``,
    whose weights hash to ``digest``).

    Returns:
        The trajectory and the observation ``(K, D)`` to start the next one from.
    """
    T, K = unroll_length, envs.num_envs
    all_obs = np.empty((T + 1, K, obs.shape[1]), dtype=np.float32)
    actions = np.empty((T, K), dtype=np.int64)
    logits = np.empty((T, K, model.num_actions), dtype=np.float32)
    rewards = np.empty((T, K), dtype=np.float32)
    dones = np.empty((T, K), dtype=bool)
    returns: list[float] = []
    for t in range(T):
        all_obs[t] = obs
        actions[t], logits[t] = act(model, obs, generator)
        step = envs.step(actions[t])
        obs, rewards[t], dones[t] = step.obs, step.rewards, step.dones
        returns.extend(step.episode_returns)
    all_obs[T] = obs
    trajectory = Trajectory(
        source, seq, version, all_obs, actions, logits, rewards, dones, tuple(returns),
        ((version, digest),),
    )  # fmt: skip
    return trajectory, obs


@torch.no_grad()
def evaluate(
    model: PolicyModel,
    envs: VectorEnv,
    episodes: int,
    max_steps: int = 100_000,
    *,
    generator: torch.Generator | None = None,
) -> list[float]:
    """The returns of the first episode of each of ``episodes`` environments
    (``envs.num_envs == episodes``): greedy (``argmax`` of the logits), or actions sampled
    with ``generator`` when one is given."""
    if envs.num_envs != episodes:
        raise ValueError(f"evaluate: {envs.num_envs} envs for {episodes} episodes; make them equal")
    obs = envs.reset()
    returns: list[float | None] = [None] * episodes
    running = np.zeros(episodes)
    for _ in range(max_steps):
        if generator is None:
            actions = model.policy(torch.from_numpy(obs)).argmax(-1).numpy()  # (K,)
        else:
            actions = act(model, obs, generator)[0]
        step = envs.step(actions)
        running += step.rewards
        for k in np.flatnonzero(step.dones):
            if returns[k] is None:
                returns[k] = float(running[k])
            running[k] = 0.0
        if all(r is not None for r in returns):
            break
        obs = step.obs
    return [float(running[k]) if r is None else r for k, r in enumerate(returns)]
