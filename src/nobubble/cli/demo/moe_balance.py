"""Load-balancing part of the MoE demo: EPLB's example, a DeepSeek-V3-like placement, a
rebalance after drift (fresh vs incremental). ``run(out_dir, quick)`` -> artifacts written;
``nobubble.cli.demo.moe`` can call it."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

from nobubble.cli.util import console
from nobubble.files import write_text

__all__ = ["run"]

EPLB_EXAMPLE = [
    [90, 132, 40, 61, 104, 165, 39, 4, 73, 56, 183, 86],
    [20, 107, 104, 64, 19, 197, 187, 157, 172, 86, 16, 27],
]


def run(out_dir: Path, quick: bool) -> list[Path]:
    """Print a short showcase; write ``moe/eplb_placement.png`` and ``moe/eplb_demo.json``."""
    from nobubble.moe.balance.eplb import load_imbalance, rebalance_experts
    from nobubble.moe.balance.eplb_reference import reference_rebalance_experts
    from nobubble.moe.balance.incremental import rebalance_experts_incremental
    from nobubble.moe.balance.report import balance_report, plot_balance

    con = console()
    example = rebalance_experts(torch.tensor(EPLB_EXAMPLE), 16, 4, 2, 8)
    same = torch.equal(
        example.phy2log, reference_rebalance_experts(torch.tensor(EPLB_EXAMPLE), 16, 4, 2, 8)[0]
    )
    con.print(
        f"EPLB published example (12 experts, 16 replicas, 8 GPUs): identical to EPLB: {same}"
    )

    layers = 2 if quick else 8
    rng = np.random.default_rng(0)
    weight = torch.tensor(rng.pareto(2.0, (layers, 256)) + 1.0) * 1000  # (L, 256)
    report = balance_report(weight, num_redundant=32, num_groups=8, num_nodes=4, num_gpus=32)
    placement = report.placement
    ref_dups = int(report.reference_duplicate_gpus.sum())
    imb_before = float(load_imbalance(report.before).mean())
    imb_after = float(load_imbalance(report.after).mean())
    con.print(
        f"DeepSeek-V3-like (256 experts + 32 redundant, 32 GPUs / 4 nodes, Pareto(2) loads, "
        f"{layers} layers): max/mean GPU load {imb_before:.2f} -> {imb_after:.3f}; GPUs holding "
        f"an expert twice, over all layers: {int(placement.duplicate_gpus().sum())} (EPLB: {ref_dups})"
    )
    drifted = weight * torch.tensor(rng.lognormal(0.0, 0.2, tuple(weight.shape)))
    inc = rebalance_experts_incremental(drifted, placement.phy2log, 8, 4, 32)
    moved, fresh = float(inc.num_moved.float().mean()), float(inc.num_moved_fresh.float().mean())
    con.print(
        f"after a 20% drift: incremental rebalance moves {moved:.0f} of 288 experts per layer "
        f"(fresh: {fresh:.0f}) at max/mean {float(inc.imbalance.mean()):.3f} "
        f"(fresh {float(inc.fresh_imbalance.mean()):.3f})"
    )
    folder = out_dir / "moe"
    folder.mkdir(parents=True, exist_ok=True)
    png = folder / "eplb_placement.png"
    plot_balance(report, png)
    summary = folder / "eplb_demo.json"
    write_text(
        summary,
        json.dumps(
            {
                "eplb_example_identical": same,
                "imbalance_before": imb_before,
                "imbalance_after": imb_after,
                "eplb_duplicate_gpus": ref_dups,
                "moved_incremental": moved,
                "moved_fresh": fresh,
            },
            indent=2,
        )
        + "\n",
    )
    return [png, summary]
