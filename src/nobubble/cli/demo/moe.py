"""``nobubble demo`` step for MoE expert parallelism.

Four local ranks (two with ``quick``) run a DeepSeek-V3-routed :class:`MoELayer` through
:class:`Buffer` (:func:`nobubble.bench.ep_layer.run_layer_check`): the first step's output and
gradients are checked against the token-by-token reference MoE in one process, the bytes
dispatch moves are compared with a per-pair all-to-all, and the auxiliary-loss-free bias is
updated after every step on a skewed token stream, which flattens the expert load. Writes
``moe/load_balance.png`` and ``moe/ep_demo.json``.
"""

from __future__ import annotations

import json
from pathlib import Path

from nobubble.bench.ep_layer import plot_loads, run_layer_check
from nobubble.cli.util import console, print_table
from nobubble.files import write_text

__all__ = ["run"]


def run(out_dir: Path, quick: bool) -> list[Path]:
    """Run the MoE showcase; returns the artifacts written under ``out_dir``."""
    ranks, num_tokens, steps = (2, 64, 12) if quick else (4, 256, 40)
    con = console()
    con.print(f"MoE layer (DeepSeek-V3 routing, 16 experts, top-4) on {ranks} gloo ranks")
    check = run_layer_check(ranks, num_tokens, steps, timeout_s=600)
    out_err, grad_err = check.max_rel_output_diff, check.max_rel_grad_diff
    print_table(
        "dispatch on the first step",
        ["rank", "rows sent per rank", "rows received per rank", "buffer bytes", "per-pair bytes"],
        [
            [r, str(check.sent_rows[r]), str(check.recv_rows[r]), check.buffer_bytes[r],
             check.pair_bytes[r]]
            for r in range(ranks)
        ],
    )  # fmt: skip
    total_buffer, total_pair = sum(check.buffer_bytes), sum(check.pair_bytes)
    con.print(
        f"dispatch moved {total_buffer:,} B vs {total_pair:,} B for a per-pair all-to-all "
        f"({total_pair / total_buffer:.2f}x); vs the token-by-token reference MoE: "
        f"max relative diff: output {out_err:.1e}, input/router grads {grad_err:.1e}"
    )
    loads = check.loads
    imbalance = [max(step) / (sum(step) / len(step)) for step in loads]
    con.print(
        f"expert load max/mean: step 1 {imbalance[0]:.2f} -> step {steps} {imbalance[-1]:.2f} "
        "(bias updated by rate * sign(mean - load) after each step)"
    )
    png = plot_loads(loads, out_dir / "moe" / "load_balance.png")
    summary = out_dir / "moe" / "ep_demo.json"
    write_text(
        summary,
        json.dumps(
            {
                "ranks": ranks,
                "buffer_bytes": total_buffer,
                "per_pair_bytes": total_pair,
                "max_rel_output_diff": out_err,
                "max_rel_grad_diff": grad_err,
                "imbalance": imbalance,
            },
            indent=2,
        )
        + "\n",
    )
    if out_err > 1e-5 or grad_err > 1e-5:
        raise RuntimeError(f"MoE layer disagrees with the reference MoE ({out_err}, {grad_err})")
    return [png, summary]
