"""GRPO's group-relative advantage (Shao et al., 2024, DeepSeekMath); no value function.

    A_i = (r_i - mean(r_group)) / (std(r_group) + eps)

with the *unbiased* std (``torch.std``'s default, as in verl and TRL): the group
``[1, 0, 0, 1]`` gives ``+-0.866``. GAE is V-trace on-policy: :func:`~nobubble.rl.algo.vtrace.vtrace`
with ``log_rhos = 0`` and GAE's lambda returns GAE's advantages as ``pg_advantages``.
"""

from __future__ import annotations

from typing import Literal, get_args

import torch

__all__ = ["GRPOScale", "grpo_advantages"]

GRPOScale = Literal["group", "batch", "none"]
_SCALES = get_args(GRPOScale)


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
            std of the whole batch (REINFORCE++), ``"none"`` does not divide (Dr. GRPO).
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
