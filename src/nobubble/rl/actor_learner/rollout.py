"""Rollouts with a local policy: an IMPALA actor's unroll, and the (greedy) evaluation.

An unroll is assembled by the same :class:`~nobubble.rl.actor_learner.trajectory.
TrajectoryBuilder` that central inference uses for its actors' streams, so the three
architectures' trajectories are made by one piece of code.
"""

from __future__ import annotations

import numpy as np
import torch

from nobubble.rl.actor_learner.config import EnvRunConfig
from nobubble.rl.actor_learner.envs import VectorEnv
from nobubble.rl.actor_learner.model import PolicyModel, act
from nobubble.rl.actor_learner.trajectory import Trajectory, TrajectoryBuilder

__all__ = ["rollout", "eval_envs", "evaluate"]


def rollout(
    model: PolicyModel,
    envs: VectorEnv,
    builder: TrajectoryBuilder,
    obs: np.ndarray,
    *,
    version: int,
    generator: torch.Generator,
    digest: str = "",
) -> tuple[Trajectory, np.ndarray]:
    """Step ``envs`` from ``obs (K, D)`` (the last observation ``builder`` saw: after
    ``envs.reset()``, ``builder.observe(obs)``) with ``model`` (policy ``version``, whose
    weights hash to ``digest``) until ``builder`` finishes a trajectory of ``T`` steps.

    Returns:
        The trajectory and the observation ``(K, D)`` to start the next one from.
    """
    while True:
        actions, logits = act(model, obs, generator)
        builder.record(actions, logits, version, digest)
        step = envs.step(actions)
        obs = step.obs
        trajectory = builder.observe(step.obs, step.rewards, step.dones)
        if trajectory is not None:
            return trajectory, obs


def eval_envs(config: EnvRunConfig) -> VectorEnv:
    """The envs a run evaluates on: ``config.eval_episodes`` of ``config.env``, seeded apart
    from every actor's (``10_000_000 + config.seed``), without the step delay."""
    return VectorEnv(config.env, config.eval_episodes, 10_000_000 + config.seed)


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
