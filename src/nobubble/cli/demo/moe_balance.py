"""``nobubble demo`` step for load balancing: EPLB's published example, a DeepSeek-V3-like
placement (:func:`~nobubble.moe.balance.report.balance_report`), a rebalance after drift
(fresh vs incremental). Writes ``moe/eplb_placement.png`` and ``moe/eplb_demo.json``."""

from __future__ import annotations

import json
from pathlib import Path

from nobubble.cli.util import console
from nobubble.files import write_text

__all__ = ["run"]

EPLB_EXAMPLE = [
    [90, 132, 40, 61, 104, 165, 39, 4, 73, 56, 183, 86],
    [20, 107, 104, 64, 19, 197, 187, 157, 172, 86, 16, 27],
]


def run(out_dir: Path, quick: bool) -> list[Path]:
    """Print a short showcase; returns the artifacts written under ``out_dir``."""
    import numpy as np
    import torch

    from nobubble.moe.balance.eplb import load_imbalance, rebalance_experts
    from nobubble.moe.balance.eplb_reference import reference_rebalance_experts
    from nobubble.moe.balance.incremental import rebalance_experts_incremental
    from nobubble.moe.balance.loads import expert_loads
    from nobubble.moe.balance.report import balance_report, plot_balance

    con = console()
    example = torch.tensor(EPLB_EXAMPLE)
    same = torch.equal(rebalance_experts(example, 16, 4, 2, 8).phy2log,
                       reference_rebalance_experts(example, 16, 4, 2, 8)[0])  # fmt: skip
    con.print(
        f"EPLB published example (12 experts, 16 replicas, 8 GPUs): identical to EPLB: {same}"
    )
    layers = 2 if quick else 8
    weight = expert_loads(256, skew="pareto:2", num_layers=layers)  # (L, 256)
    report = balance_report(weight, num_redundant=32, num_groups=8, num_nodes=4, num_gpus=32)
    s = {"eplb_example_identical": same,
         "imbalance_before": float(load_imbalance(report.before).mean()),
         "imbalance_after": float(load_imbalance(report.after).mean()),
         "eplb_duplicate_gpus": int(report.reference_duplicate_gpus.sum())}  # fmt: skip
    con.print(
        f"DeepSeek-V3-like (256 experts + 32 redundant, 32 GPUs / 4 nodes, Pareto(2) loads, "
        f"{layers} layers): max/mean GPU load {s['imbalance_before']:.2f} -> "
        f"{s['imbalance_after']:.3f}; GPUs holding an expert twice, over all layers: "
        f"{int(report.placement.duplicate_gpus().sum())} (EPLB: {s['eplb_duplicate_gpus']})"
    )
    drift = np.random.default_rng(1).lognormal(0.0, 0.2, tuple(weight.shape))
    inc = rebalance_experts_incremental(weight * torch.tensor(drift), report.placement.phy2log,
                                        8, 4, 32)  # fmt: skip
    s["moved_incremental"] = float(inc.num_moved.float().mean())
    s["moved_fresh"] = float(inc.num_moved_fresh.float().mean())
    con.print(
        f"after a 20% drift: incremental rebalance moves {s['moved_incremental']:.0f} of 288 "
        f"experts per layer (fresh: {s['moved_fresh']:.0f}) at max/mean "
        f"{float(inc.imbalance.mean()):.3f} (fresh {float(inc.fresh_imbalance.mean()):.3f})"
    )
    folder = out_dir / "moe"
    folder.mkdir(parents=True, exist_ok=True)
    png = plot_balance(report, folder / "eplb_placement.png")
    return [png, write_text(folder / "eplb_demo.json", json.dumps(s, indent=2) + "\n")]
