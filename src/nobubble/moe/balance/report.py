"""One EPLB placement measured: per-GPU load before (no redundancy) and after, beside
DeepSeek's original EPLB on the same loads; and its picture. Shapes: ``L`` MoE layers,
``E`` logical experts, ``R`` physical experts, ``G`` GPUs.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from nobubble.files import figure
from nobubble.moe.balance import eplb
from nobubble.moe.balance.eplb import (
    ExpertPlacement,
    Policy,
    check_config,
    duplicate_gpus,
    gpu_loads,
    load_imbalance,
)
from nobubble.moe.balance.eplb_reference import reference_rebalance_experts
from nobubble.moe.balance.incremental import rebalance_experts_incremental
from nobubble.moe.balance.loads import expert_loads, static_gpu_loads
from nobubble.moe.balance.problem import MAX_SLOTS

__all__ = ["MAX_SLOTS", "BalanceReport", "balance_report", "plot_balance", "eplb_tour"]

EPLB_EXAMPLE = [
    [90, 132, 40, 61, 104, 165, 39, 4, 73, 56, 183, 86],
    [20, 107, 104, 64, 19, 197, 187, 157, 172, 86, 16, 27],
]
"""EPLB's published example: the loads of 12 experts in 2 layers."""


@dataclass(frozen=True)
class BalanceReport:
    """A placement of ``num_experts + num_redundant`` physical experts and its loads."""

    num_experts: int
    num_redundant: int
    num_groups: int
    num_nodes: int
    num_gpus: int
    placement: ExpertPlacement
    """The EPLB placement (its ``policy`` is the one that ran)."""
    before: torch.Tensor
    """(L, G) float64: GPU loads with each expert once, in order (:func:`static_gpu_loads`)."""
    after: torch.Tensor
    """(L, G) float64: GPU loads of :attr:`placement`."""
    reference_loads: torch.Tensor
    """(L, G) float64: GPU loads of DeepSeek's original EPLB on the same loads and policy."""
    reference_duplicate_gpus: torch.Tensor
    """(L,) int64: GPUs where the original puts some expert twice."""

    def to_dict(self) -> dict[str, Any]:
        """The report as JSON-ready lists (``ep balance --json``)."""
        p = self.placement
        return {
            "experts": self.num_experts,
            "gpus": self.num_gpus,
            "nodes": self.num_nodes,
            "groups": self.num_groups,
            "redundant": self.num_redundant,
            "policy": p.policy,
            "imbalance_before": load_imbalance(self.before).tolist(),
            "imbalance": load_imbalance(self.after).tolist(),
            "duplicate_gpus": p.duplicate_gpus().tolist(),
            "eplb_original_imbalance": load_imbalance(self.reference_loads).tolist(),
            "eplb_original_duplicate_gpus": self.reference_duplicate_gpus.tolist(),
            "gpu_load_before": self.before.tolist(),
            "gpu_load_after": self.after.tolist(),
            "phy2log": p.phy2log.tolist(),
            "gpu_experts": p.phy2log.view(p.num_layers, self.num_gpus, -1).tolist(),  # (L,G,R/G)
            "logcnt": p.logcnt.tolist(),
        }


def balance_report(
    weight: torch.Tensor,
    *,
    num_redundant: int,
    num_groups: int,
    num_nodes: int,
    num_gpus: int,
    policy: Policy = "auto",
) -> BalanceReport:
    """Place ``E + num_redundant`` physical experts for loads ``weight (L, E)`` with
    :func:`~nobubble.moe.balance.eplb.rebalance_experts` and measure it against no redundancy
    and against DeepSeek's original EPLB (whose global policy is one group on one node).

    Raises ValueError (:func:`~nobubble.moe.balance.eplb.check_config`'s) for a placement
    EPLB cannot do.
    """
    num_experts = weight.shape[1]
    num_replicas = num_experts + num_redundant
    check_config(num_experts, num_replicas, num_groups, num_nodes, num_gpus, policy)
    # looked up on its module at each call, so a wrapper installed there (a test's) applies
    placement = eplb.rebalance_experts(weight, num_replicas, num_groups, num_nodes, num_gpus,
                                       policy=policy)  # fmt: skip
    hier = placement.policy == "hierarchical"
    ref_phy2log, _, _ = reference_rebalance_experts(
        weight, num_replicas, num_groups if hier else 1, num_nodes if hier else 1, num_gpus
    )
    return BalanceReport(
        num_experts=num_experts,
        num_redundant=num_redundant,
        num_groups=num_groups,
        num_nodes=num_nodes,
        num_gpus=num_gpus,
        placement=placement,
        before=static_gpu_loads(weight, num_gpus),
        after=placement.gpu_loads(weight),
        reference_loads=gpu_loads(weight, ref_phy2log, num_gpus),
        reference_duplicate_gpus=duplicate_gpus(ref_phy2log, num_gpus),
    )


def plot_balance(report: BalanceReport, path: Path) -> Path:
    """Draw layer 0's per-GPU loads before / after the placement side by side (PNG or SVG)."""
    before, after = report.before[0], report.after[0]  # (G,)
    imbalance = float(load_imbalance(after))
    num_gpus = len(before)
    p = report.placement
    size = (max(8, num_gpus * 0.35 + 4), 3.5)
    with figure(path, 1, 2, figsize=size, sharey=True, dpi=100) as (fig, axes):
        for ax, loads, title in (
            (axes[0], before, f"before: max/mean {float(before.max() / before.mean()):.3f}"),
            (axes[1], after, f"after EPLB: max/mean {imbalance:.3f}"),
        ):
            ax.bar(range(num_gpus), loads.tolist(), color="#4c72b0")
            ax.axhline(float(loads.mean()), color="#c44e52", lw=1, ls="--", label="mean")
            ax.set_title(title)
            ax.set_xlabel("GPU")
        axes[0].set_ylabel("tokens (layer 0)")
        axes[0].legend()
        fig.suptitle(f"{p.num_replicas} physical experts on {num_gpus} GPUs ({p.policy})")
    return path


def eplb_tour(num_layers: int) -> tuple[dict[str, Any], BalanceReport]:
    """What the demo shows of EPLB: whether this placement of :data:`EPLB_EXAMPLE` (16
    replicas, 4 groups, 2 nodes, 8 GPUs) is EPLB's own, a DeepSeek-V3-like placement of
    ``num_layers`` layers (256 experts + 32 redundant, 8 groups, 32 GPUs / 4 nodes, Pareto(2)
    loads), and a rebalance of it after a 20% drift, incremental vs fresh. Returns the
    figures by name (JSON-ready) and the placement's report."""
    import numpy as np

    example = torch.tensor(EPLB_EXAMPLE)
    same = torch.equal(eplb.rebalance_experts(example, 16, 4, 2, 8).phy2log,
                       reference_rebalance_experts(example, 16, 4, 2, 8)[0])  # fmt: skip
    weight = expert_loads(256, skew="pareto:2", num_layers=num_layers)  # (L, 256)
    report = balance_report(weight, num_redundant=32, num_groups=8, num_nodes=4, num_gpus=32)
    drift = np.random.default_rng(1).lognormal(0.0, 0.2, tuple(weight.shape))
    inc = rebalance_experts_incremental(weight * torch.tensor(drift), report.placement.phy2log,
                                        8, 4, 32)  # fmt: skip
    return {"eplb_example_identical": same,
            "imbalance_before": float(load_imbalance(report.before).mean()),
            "imbalance_after": float(load_imbalance(report.after).mean()),
            "duplicate_gpus": int(report.placement.duplicate_gpus().sum()),
            "eplb_duplicate_gpus": int(report.reference_duplicate_gpus.sum()),
            "moved_incremental": float(inc.num_moved.float().mean()),
            "moved_fresh": float(inc.num_moved_fresh.float().mean()),
            "imbalance_incremental": float(inc.imbalance.mean()),
            "imbalance_fresh": float(inc.fresh_imbalance.mean())}, report  # fmt: skip
