"""Live expert-load statistics: tokens per logical expert, averaged over a moving window.

Dispatch adds the (token, slot) pairs each *local physical* expert received into an integer
counter (``cumulative_local_expert_recv_stats``, as in DeepEP). Once per training step the
counters of all ranks are gathered, folded from physical to logical experts through
``phy2log`` and recorded here; the average over the last ``window`` steps is what the
rebalancer places replicas for (DeepSeek-V3 re-chooses its redundant experts from such
statistics about every ten minutes).

Shape legend: ``L`` MoE layers, ``E`` logical experts, ``R`` physical experts.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from nobubble.validation import check_fields

__all__ = ["ExpertLoadStats", "logical_load"]


def logical_load(physical_load: torch.Tensor, phy2log: torch.Tensor, num_logical_experts: int):
    """Fold ``physical_load (..., R)`` into ``(..., E)`` int64/float: sum over each expert's replicas."""
    if physical_load.shape[-1] != phy2log.shape[-1]:
        raise ValueError(
            f"physical_load has {physical_load.shape[-1]} experts, phy2log {phy2log.shape[-1]}"
        )
    out = torch.zeros(
        (*physical_load.shape[:-1], num_logical_experts),
        dtype=physical_load.dtype,
        device=physical_load.device,
    )
    index = phy2log.to(physical_load.device).expand_as(physical_load)
    return out.scatter_add_(-1, index, physical_load)


@dataclass(kw_only=True)
class ExpertLoadStats:
    """Tokens per logical expert over the last ``window`` recorded steps, per layer.

    Lifecycle: ``record`` once per step (all ranks, same values) -> ``moving_average`` when a
    rebalance is due. ``cumulative`` keeps the all-time totals.
    """

    num_logical_experts: int
    """``E``."""
    num_layers: int = 1
    """``L``."""
    window: int = 16
    """Steps in the moving average (DeepSeek-V3 rebalances from ~10 minutes of traffic)."""
    history: torch.Tensor = field(init=False, repr=False)
    cumulative: torch.Tensor = field(init=False, repr=False)
    steps: int = field(init=False, default=0)

    def __post_init__(self) -> None:
        names = ("num_logical_experts", "num_layers", "window")
        check_fields("ExpertLoadStats", self, names, ">= 1", integer=True)
        shape = (self.window, self.num_layers, self.num_logical_experts)
        self.history = torch.zeros(shape, dtype=torch.float64)  # (W, L, E) ring buffer
        self.cumulative = torch.zeros(shape[1:], dtype=torch.int64)  # (L, E)

    def record(self, load: torch.Tensor) -> None:
        """Add one step's tokens per logical expert, ``(L, E)`` or ``(E,)`` for one layer."""
        load = load.detach().cpu()
        if load.dim() == 1:
            load = load.unsqueeze(0)
        if tuple(load.shape) != (self.num_layers, self.num_logical_experts):
            raise ValueError(
                f"ExpertLoadStats.record: load shape {tuple(load.shape)} != "
                f"({self.num_layers}, {self.num_logical_experts})"
            )
        if (load < 0).any():
            raise ValueError("ExpertLoadStats.record: loads must be >= 0")
        self.history[self.steps % self.window] = load.double()
        self.cumulative += load.round().long()
        self.steps += 1

    def moving_average(self) -> torch.Tensor:
        """(L, E) float64: mean tokens per step over the last ``min(steps, window)`` steps."""
        if self.steps == 0:
            raise ValueError("ExpertLoadStats: no step recorded yet; run a step first")
        filled = min(self.steps, self.window)
        return self.history[:filled].mean(0) if filled < self.window else self.history.mean(0)

    def reset(self) -> None:
        self.history.zero_()
        self.cumulative.zero_()
        self.steps = 0
