"""The MLP actor-critic for vector observations and categorical actions.

Two separate two-layer tanh MLPs (policy and value), orthogonally initialised with a small
last policy layer, as in cleanrl's ``ppo.py``: the policy starts near uniform and the value
head does not share features that its loss would pull around.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import nn

__all__ = ["ActorCritic", "act"]


def _layer(n_in: int, n_out: int, gain: float) -> nn.Linear:
    layer = nn.Linear(n_in, n_out)
    nn.init.orthogonal_(layer.weight, gain)
    nn.init.zeros_(layer.bias)
    return layer


class ActorCritic(nn.Module):
    """``obs (..., D) -> (logits (..., A), value (...))``."""

    def __init__(self, obs_dim: int, num_actions: int, hidden: int = 64) -> None:
        super().__init__()
        self.obs_dim, self.num_actions = obs_dim, num_actions
        root2 = math.sqrt(2.0)
        self.policy = nn.Sequential(
            _layer(obs_dim, hidden, root2), nn.Tanh(),
            _layer(hidden, hidden, root2), nn.Tanh(),
            _layer(hidden, num_actions, 0.01),
        )  # fmt: skip
        self.value = nn.Sequential(
            _layer(obs_dim, hidden, root2), nn.Tanh(),
            _layer(hidden, hidden, root2), nn.Tanh(),
            _layer(hidden, 1, 1.0),
        )  # fmt: skip

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.policy(obs), self.value(obs).squeeze(-1)


@torch.no_grad()
def act(
    model: ActorCritic, obs: np.ndarray, generator: torch.Generator | None = None
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
