"""Data x expert parallelism: the process groups, which parameters are experts, gradient sync.

Ranks form a ``dp x ep`` grid, ``rank = dp_index * ep + ep_index``: ``ep`` consecutive ranks
form an expert-parallel group, ranks with the same ``ep_index`` a data-parallel group. With the
loss the mean over all ``W = dp * ep`` ranks, :func:`sync_gradients` sums a non-expert
gradient over all ranks and an expert gradient over its DP group (dispatch and combine
already carried its EP group's part), both divided by ``W``. The layer marks its expert
parameters (:meth:`~nobubble.moe.layer.MoELayer.expert_parameters`).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta

import torch.distributed as dist
from torch import nn

from nobubble.moe.layer import MoELayer

__all__ = [
    "DataExpertGroups",
    "dp_ep_groups",
    "expert_parameters",
    "non_expert_parameters",
    "sync_gradients",
]


@dataclass(frozen=True, eq=False)
class DataExpertGroups:
    """This rank's place in a ``dp x ep`` grid and its two groups (``None``: size 1)."""

    dp: int
    ep: int
    dp_rank: int
    ep_rank: int
    dp_group: dist.ProcessGroup | None
    ep_group: dist.ProcessGroup | None


def dp_ep_groups(dp: int, ep: int, *, timeout_s: float = 120.0) -> DataExpertGroups:
    """Build the grid's groups on every rank (a collective: all ranks call it alike)."""
    world, rank = dist.get_world_size(), dist.get_rank()
    if dp < 1 or ep < 1 or dp * ep != world:
        raise ValueError(
            f"dp_ep_groups: dp={dp} x ep={ep} must equal the world size {world}; "
            f"pick dp * ep == {world}"
        )
    timeout = timedelta(seconds=timeout_s)
    ep_groups = [dist.new_group([d * ep + i for i in range(ep)], timeout=timeout)
                 for d in range(dp)]  # fmt: skip
    dp_groups = [dist.new_group([d * ep + i for d in range(dp)], timeout=timeout)
                 for i in range(ep)]  # fmt: skip
    d, i = divmod(rank, ep)
    return DataExpertGroups(
        dp=dp, ep=ep, dp_rank=d, ep_rank=i,
        dp_group=dp_groups[i] if dp > 1 else None, ep_group=ep_groups[d],
    )  # fmt: skip


def _moe_layers(model: nn.Module) -> Iterator[MoELayer]:
    return (m for m in model.modules() if isinstance(m, MoELayer))


def expert_parameters(model: nn.Module) -> list[nn.Parameter]:
    """The routed experts' parameters of every MoE layer in ``model``."""
    return [p for layer in _moe_layers(model) for p in layer.expert_parameters()]


def non_expert_parameters(model: nn.Module) -> list[nn.Parameter]:
    """Every other parameter of ``model`` (routers, shared experts, the dense layers)."""
    experts = {id(p) for p in expert_parameters(model)}
    return [p for p in model.parameters() if id(p) not in experts]


def sync_gradients(
    model: nn.Module,
    dp_group: dist.ProcessGroup | None = None,
    ep_group: dist.ProcessGroup | None = None,
    *,
    group: dist.ProcessGroup | None = None,
) -> None:
    """Turn each rank's ``.grad`` into the gradient of the mean loss over all ranks.

    ``dp_group``: the ranks holding the same experts (None: no data parallelism);
    ``ep_group``: this rank's expert-parallel group (None: the default group). ``group``: the
    whole ``dp x ep`` grid, every rank of both (None: the default group); inside a pipeline
    stage it is the stage's grid, a subgroup of the world.
    """
    world = dist.get_world_size(group)
    dp = dist.get_world_size(dp_group) if dp_group is not None else 1
    ep = dist.get_world_size(ep_group)
    if dp * ep != world:
        raise ValueError(
            f"sync_gradients: dp group of {dp} x ep group of {ep} ranks is not the world of "
            f"{world}; pass the groups dp_ep_groups built"
        )
    for p in non_expert_parameters(model):
        if p.grad is not None:
            dist.all_reduce(p.grad, group=group)
            p.grad.div_(world)
    for p in expert_parameters(model):
        if p.grad is not None:
            if dp_group is not None:
                dist.all_reduce(p.grad, group=dp_group)
            p.grad.div_(world)
