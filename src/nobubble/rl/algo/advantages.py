"""Advantage estimators: GRPO's group-relative advantage and GAE for value-based runs.

GRPO (Shao et al., 2024, DeepSeekMath) scores each response against the other responses to
the same prompt, so it needs no value function:

    A_i = (r_i - mean(r_group)) / (std(r_group) + eps)

with the *unbiased* standard deviation (``torch.std``'s default, as in verl and TRL), so the
group ``[1, 0, 0, 1]`` gives ``+-0.866``. ``scale="batch"`` divides by the batch std instead
(REINFORCE++-style), ``scale="none"`` keeps only the mean-centering (Dr. GRPO, Liu et al.,
2025). A group whose rewards are all equal, or that has one member, carries no signal: its
advantages are exactly 0.

GAE (Schulman et al., 2016) is written the way the paper writes it, time-major ``[T, B]``:

    delta_t = r_t + gamma_t * V(x_{t+1}) - V(x_t)
    A_t     = delta_t + gamma_t * lambda * A_{t+1}
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

__all__ = ["GRPOScale", "GAEReturns", "grpo_advantages", "gae"]

GRPOScale = Literal["group", "batch", "none"]
_SCALES = ("group", "batch", "none")


def grpo_advantages(
    rewards: torch.Tensor,
    group_size: int,
    scale: GRPOScale = "group",
    eps: float = 1e-6,
) -> torch.Tensor:
    """Group-relative advantages for ``rewards`` laid out group after group.

    Args:
        rewards: ``(N,)`` float, ``N = num_groups * group_size``; responses ``g*group_size ..
            (g+1)*group_size - 1`` answer the same prompt.
        group_size: responses per prompt, >= 1.
        scale: ``"group"`` divides by the group's unbiased std, ``"batch"`` by the unbiased
            std of the whole batch, ``"none"`` does not divide.
        eps: added to the std before dividing, > 0.
    Returns:
        ``(N,)`` advantages, same dtype as ``rewards``, no gradient. Zero-variance groups and
        singleton groups give exactly 0.
    """
    if rewards.dim() != 1:
        raise ValueError(
            f"grpo_advantages: rewards has shape {tuple(rewards.shape)}; pass a 1-D tensor "
            "(num_groups * group_size,) with each group's responses adjacent"
        )
    if group_size < 1 or rewards.numel() % group_size != 0:
        raise ValueError(
            f"grpo_advantages: group_size={group_size} must be >= 1 and divide the number of "
            f"rewards ({rewards.numel()}); drop or pad incomplete groups first"
        )
    if scale not in _SCALES:
        raise ValueError(f"grpo_advantages: scale={scale!r}; use one of {_SCALES}")
    if eps <= 0:
        raise ValueError(f"grpo_advantages: eps={eps} must be > 0")
    rewards = rewards.detach()
    groups = rewards.reshape(-1, group_size)  # (G, group_size)
    centered = groups - groups.mean(dim=1, keepdim=True)  # (G, group_size)
    if group_size == 1:
        return torch.zeros_like(rewards)
    # A group whose rewards are all equal carries no signal. Its mean can still differ from
    # the rewards in the last bit (e.g. 6 * -2.0 + 1.3087), and dividing that rounding error
    # by an equally tiny std would turn it into an advantage of order 1: zero such groups.
    spread = groups.amax(dim=1, keepdim=True) - groups.amin(dim=1, keepdim=True)  # (G, 1)
    tiny = 16 * torch.finfo(groups.dtype).eps * groups.abs().amax(dim=1, keepdim=True)
    centered = torch.where(spread <= tiny, torch.zeros_like(centered), centered)
    if scale == "group":
        centered = centered / (groups.std(dim=1, keepdim=True) + eps)
    elif scale == "batch" and rewards.numel() > 1:
        centered = centered / (rewards.std() + eps)
    return centered.reshape(-1)


@dataclass(frozen=True)
class GAEReturns:
    """GAE output, time-major.

    Attributes:
        advantages: ``[T, B, ...]`` generalized advantage estimates, no gradient.
        returns: ``[T, B, ...]`` value targets ``advantages + values``, no gradient.
    """

    advantages: torch.Tensor
    returns: torch.Tensor


def gae(
    rewards: torch.Tensor,
    values: torch.Tensor,
    bootstrap_value: torch.Tensor,
    discounts: torch.Tensor | float,
    lambda_: float = 0.95,
) -> GAEReturns:
    """Generalized advantage estimation (Schulman et al., 2016), time-major.

    Args:
        rewards: ``[T, B, ...]`` float, r_t.
        values: ``[T, B, ...]`` float, V(x_t).
        bootstrap_value: ``[B, ...]`` float, V(x_T).
        discounts: ``[T, B, ...]`` or a float: gamma_t, 0 where the episode ended at t.
        lambda_: GAE lambda in [0, 1].
    Returns:
        :class:`GAEReturns` with detached tensors.
    """
    if not 0.0 <= lambda_ <= 1.0:
        raise ValueError(f"gae: lambda_={lambda_} must be in [0, 1]")
    if values.shape != rewards.shape or bootstrap_value.shape != values.shape[1:]:
        raise ValueError(
            f"gae: rewards {tuple(rewards.shape)}, values {tuple(values.shape)} and "
            f"bootstrap_value {tuple(bootstrap_value.shape)} must be [T, B, ...], [T, B, ...] "
            "and [B, ...]"
        )
    with torch.no_grad():
        rewards, values, bootstrap_value = (
            rewards.detach(),
            values.detach(),
            bootstrap_value.detach(),
        )
        discounts = torch.as_tensor(discounts, dtype=values.dtype, device=values.device)
        discounts = discounts.expand_as(values)
        next_values = torch.cat([values[1:], bootstrap_value.unsqueeze(0)])  # [T, B, ...]
        deltas = rewards + discounts * next_values - values
        advantages = torch.empty_like(values)
        running = torch.zeros_like(bootstrap_value)
        for t in reversed(range(values.shape[0])):
            running = deltas[t] + discounts[t] * lambda_ * running
            advantages[t] = running
        return GAEReturns(advantages=advantages, returns=advantages + values)
