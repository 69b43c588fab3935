"""The models the core runs: what it needs of one, and the MLP actor-critic.

:class:`PolicyModel` is the contract every model keeps (the MLP here, the text policy of
:mod:`nobubble.rl.actor_learner.text.policy`); :func:`build_model` makes a run's model from
its config, in the learner and in every impala actor alike (:func:`initial_model`: the
learner's, seeded).

The MLP: two separate two-layer tanh MLPs (policy and value), orthogonally initialised with a small
last policy layer, as in cleanrl's ``ppo.py``: the policy starts near uniform and the value
head does not share features that its loss would pull around.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import torch
from torch import nn

if TYPE_CHECKING:
    from nobubble.rl.actor_learner.config import EnvRunConfig

__all__ = ["ActorCritic", "PolicyModel", "act", "build_model", "initial_model"]


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
    from nobubble.rl.actor_learner.envs import env_spaces

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
    """Sample actions for a batch of observations.

    Args:
        obs: ``(N, D)`` float32.
    Returns:
        ``actions (N,)`` int64 and the behaviour ``logits (N, A)`` float32.
    """
    logits = model.policy(torch.from_numpy(obs))  # (N, A)
    probs = torch.softmax(logits, dim=-1)
    actions = torch.multinomial(probs, 1, generator=generator).squeeze(-1)  # (N,)
    return actions.numpy(), logits.numpy()
