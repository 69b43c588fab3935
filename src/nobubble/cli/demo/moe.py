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
    print_table(
        "dispatch on the first step",
        ["rank", "rows sent per rank", "rows received per rank", "buffer bytes", "per-pair bytes"],
        [[r, str(check.sent_rows[r]), str(check.recv_rows[r]), check.buffer_bytes[r],
          check.pair_bytes[r]] for r in range(ranks)],
    )  # fmt: skip
    s = check.summary()
    con.print(
        f"dispatch moved {s['buffer_bytes']:,} B vs {s['per_pair_bytes']:,} B for a per-pair "
        f"all-to-all ({s['per_pair_bytes'] / s['buffer_bytes']:.2f}x); vs the token-by-token "
        f"reference MoE: max relative diff: output {s['max_rel_output_diff']:.1e}, "
        f"input/router grads {s['max_rel_grad_diff']:.1e}\n"
        f"expert load max/mean: step 1 {s['imbalance'][0]:.2f} -> step {steps} "
        f"{s['imbalance'][-1]:.2f} (bias updated by rate * sign(mean - load) after each step)"
    )
    png = plot_loads(check.loads, out_dir / "moe" / "load_balance.png")
    summary = write_text(out_dir / "moe" / "ep_demo.json", json.dumps(s, indent=2) + "\n")
    if max(s["max_rel_output_diff"], s["max_rel_grad_diff"]) > 1e-5:
        raise RuntimeError(f"MoE layer disagrees with the reference MoE: {s}")
    return [png, summary]
