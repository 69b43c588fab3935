"""Experts you bring: a per-expert ``nn.Module`` factory, grouped into this rank's experts.

The contract of an expert module, as :class:`~nobubble.moe.layer.MoELayer` calls it::

    experts(recv_x, local_expert_ids, weights) -> out
    # recv_x [M, H]; local_expert_ids [M, K] int64 (-1: another rank's expert)
    # weights [M, K] (0 where the id is -1); out [M, H]: sum over slots of weights * expert(row)

:class:`GroupedExperts` implements it from ``factory(global_expert_id) -> nn.Module`` (``[n, H]
-> [n, H]``); every expert runs, even on zero rows, so every rank's autograd graph reaches the
collectives of the backward.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

__all__ = ["GroupedExperts", "check_expert_output"]


class GroupedExperts(nn.Module):
    """This rank's share of ``num_experts`` experts, each built by ``factory(expert_id)``.

    Args:
        factory: ``factory(global expert id) -> nn.Module`` (``[n, H] -> [n, H]``); build
            the same expert for the same id on every rank (seed it with the id).
        num_experts: ``E``, all experts of the layer.
        rank, num_ranks: this rank's place in the expert-parallel group; it holds experts
            ``[rank * L, (rank + 1) * L)`` with ``L = E / num_ranks``.
    """

    def __init__(
        self,
        factory: Callable[[int], nn.Module],
        num_experts: int,
        *,
        rank: int = 0,
        num_ranks: int = 1,
    ) -> None:
        super().__init__()
        if num_ranks < 1 or num_experts % num_ranks:
            raise ValueError(
                f"GroupedExperts: num_experts={num_experts} is not a multiple of "
                f"num_ranks={num_ranks}; use a multiple of the expert-parallel ranks"
            )
        local = num_experts // num_ranks
        self.first_expert = rank * local
        self.experts = nn.ModuleList(factory(self.first_expert + i) for i in range(local))

    def forward(
        self, x: torch.Tensor, local_expert_ids: torch.Tensor, weights: torch.Tensor
    ) -> torch.Tensor:
        """``[M, H]``, ``[M, K]``, ``[M, K]`` -> ``[M, H]`` (see the module docstring)."""
        out = torch.zeros_like(x)  # (M, H)
        for e, expert in enumerate(self.experts):
            rows, slots = (local_expert_ids == e).nonzero(as_tuple=True)
            y = expert(x[rows])  # (rows, H)
            check_expert_output(expert, x[rows], y)
            out = out.index_add(0, rows, y * weights[rows, slots].unsqueeze(1).to(y.dtype))
        return out


def check_expert_output(module: nn.Module, x: torch.Tensor, out: object) -> None:
    """Refuse an expert (or experts) module whose output is not a tensor shaped like ``x``."""
    if not isinstance(out, torch.Tensor) or out.shape != x.shape:
        got = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
        raise ValueError(
            f"expert module {type(module).__name__} returned {got} for input "
            f"{tuple(x.shape)}; an expert must map [n, H] rows to [n, H]"
        )
