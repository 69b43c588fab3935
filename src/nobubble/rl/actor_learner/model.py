"""The models the core runs and how they act: the model contract, the MLP actor-critic,
sampling (:func:`act`), an IMPALA actor's unroll (:func:`rollout`) and :func:`evaluate`.

The MLP: two separate two-layer tanh MLPs (policy and value), orthogonally initialised with
a small last policy layer, as in cleanrl's ``ppo.py``: the policy starts near uniform and the
value head does not share features that its loss would pull around.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import torch
from torch import nn

from nobubble.rl.actor_learner.envs import VectorEnv, env_spaces

if TYPE_CHECKING:
    from nobubble.rl.actor_learner.config import EnvRunConfig
    from nobubble.rl.actor_learner.trajectory import Trajectory, TrajectoryBuilder

__all__ = [
    "ActorCritic",
    "PolicyModel",
    "act",
    "build_model",
    "evaluate",
    "initial_model",
    "rollout",
]


class PolicyModel(Protocol):
    """What the learner, the actors and central inference need of a model (an ``nn.Module``).

    ``model(obs (..., D)) -> (logits (..., A), value (...))`` and ``model.policy(obs (N, D))
    -> logits (N, A)``, float32; ``obs_dim`` (D) and ``num_actions`` (A) as the env's spaces
    give them. The module's parameters are what the optimiser and the impala weight
    broadcast see, so two models made by the same factory must have the same shapes.
    """

    obs_dim: int
    num_actions: int

    def __call__(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]: ...
    def policy(self, obs: torch.Tensor) -> torch.Tensor: ...
    def parameters(self, recurse: bool = True) -> Any: ...
    def state_dict(self) -> Any: ...


def build_model(config: EnvRunConfig, obs_dim: int, num_actions: int) -> Any:
    """``config.model(obs_dim, num_actions)``, or the MLP :class:`ActorCritic`.

    Raises:
        ValueError: the factory's model disagrees with the env's spaces.
    """
    if config.model is None:
        return ActorCritic(obs_dim, num_actions, config.hidden)
    model = config.model(obs_dim, num_actions)
    made = (getattr(model, "obs_dim", None), getattr(model, "num_actions", None))
    if made != (obs_dim, num_actions):
        raise ValueError(
            f"model factory {config.model!r} made a model with obs_dim={made[0]}, "
            f"num_actions={made[1]}; the env has obs_dim={obs_dim}, num_actions={num_actions}"
        )
    return model


def initial_model(config: EnvRunConfig) -> Any:
    """The untrained model ``train(config)`` starts from: :func:`build_model` for
    ``config.env``'s spaces after ``torch.manual_seed(config.seed)``."""
    torch.manual_seed(config.seed)
    return build_model(config, *env_spaces(config.env))


def _mlp(n_in: int, hidden: int, n_out: int, last_gain: float) -> nn.Sequential:
    """Two orthogonally initialised tanh layers of width ``hidden``, then a linear one."""
    layers: list[nn.Module] = []
    for a, b, gain in ((n_in, hidden, math.sqrt(2.0)), (hidden, hidden, math.sqrt(2.0)),
                       (hidden, n_out, last_gain)):  # fmt: skip
        layer = nn.Linear(a, b)
        nn.init.orthogonal_(layer.weight, gain)
        nn.init.zeros_(layer.bias)
        layers += [layer, nn.Tanh()]
    return nn.Sequential(*layers[:-1])


class ActorCritic(nn.Module):
    """``obs (..., D) -> (logits (..., A), value (...))``."""

    def __init__(self, obs_dim: int, num_actions: int, hidden: int = 64) -> None:
        super().__init__()
        self.obs_dim, self.num_actions = obs_dim, num_actions
        self.policy = _mlp(obs_dim, hidden, num_actions, 0.01)
        self.value = _mlp(obs_dim, hidden, 1, 1.0)

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.policy(obs), self.value(obs).squeeze(-1)


@torch.no_grad()
def act(
    model: PolicyModel, obs: np.ndarray, generator: torch.Generator | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Sample actions for ``obs (N, D)`` float32: ``actions (N,)`` int64 and the behaviour
    ``logits (N, A)`` float32; greedy (``argmax``) when ``generator`` is None."""
    logits = model.policy(torch.from_numpy(obs))  # (N, A)
    if generator is None:
        return logits.argmax(-1).numpy(), logits.numpy()
    probs = torch.softmax(logits, dim=-1)
    actions = torch.multinomial(probs, 1, generator=generator).squeeze(-1)  # (N,)
    return actions.numpy(), logits.numpy()


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
    weights hash to ``digest``) until ``builder`` finishes a trajectory of ``T`` steps;
    that trajectory and the observation ``(K, D)`` to start the next one from."""
    while True:
        actions, logits = act(model, obs, generator)
        builder.record(actions, logits, version, digest)
        step = envs.step(actions)
        obs = step.obs
        trajectory = builder.observe(step.obs, step.rewards, step.dones)
        if trajectory is not None:
            return trajectory, obs


@torch.no_grad()
def evaluate(
    model: PolicyModel | None,
    config: EnvRunConfig,
    episodes: int | None = None,
    *,
    seed: int | None = None,
    sampled: bool = False,
    max_steps: int = 100_000,
) -> list[float]:
    """The return of the first episode of each of ``episodes`` (default
    ``config.eval_episodes``) fresh envs of ``config.env`` without the step delay, seeded
    ``seed, seed + 1, ...`` (default ``10_000_000 + config.seed``: apart from every actor's).

    Args:
        model: the policy; None: the untrained one ``train(config)`` starts from.
        sampled: sample actions (a generator seeded with ``seed``) instead of ``argmax``.
    """
    model = initial_model(config) if model is None else model
    episodes = config.eval_episodes if episodes is None else episodes
    seed = 10_000_000 + config.seed if seed is None else seed
    generator = torch.Generator().manual_seed(seed) if sampled else None
    envs = VectorEnv(config.env, episodes, seed)
    obs = envs.reset()
    returns: list[float | None] = [None] * episodes
    running = np.zeros(episodes)
    for _ in range(max_steps):
        step = envs.step(act(model, obs, generator)[0])
        running += step.rewards
        for k in np.flatnonzero(step.dones):
            if returns[k] is None:
                returns[k] = float(running[k])
            running[k] = 0.0
        if all(r is not None for r in returns):
            break
        obs = step.obs
    envs.close()
    return [float(running[k]) if r is None else r for k, r in enumerate(returns)]
