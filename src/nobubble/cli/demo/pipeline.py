"""``nobubble demo`` step for pipelines: text grids, the comparison table, a Gantt chart.

1. The textbook example, P=4 and M=8 with unit costs: 1F1B's grid (bubble (P-1)/M of the
   work) beside ZB-H1's, where W fills the warm-up/cool-down bubbles.
2. The comparison table at P=8, M=24 with the Zero Bubble paper's measured 1.5B costs: bubble,
   peak activation memory and throughput of every schedule relative to 1F1B, ours beside
   torch's own.
3. A PNG Gantt chart of 1F1B, ZB-H1, ZB-2p and ZB-V on those costs, under ``out_dir``.
"""

from __future__ import annotations

from pathlib import Path

from nobubble.cli.util import console, print_table
from nobubble.pipeline.compare import compare_schedules
from nobubble.pipeline.costs import PAPER_TIMES, CostModel
from nobubble.pipeline.plot import ascii_grid, gantt_grid
from nobubble.pipeline.schedules import get_schedule
from nobubble.pipeline.simulate import simulate


def run(out_dir: Path, quick: bool) -> list[Path]:
    con = console()
    unit = CostModel.uniform(4)
    for name in ("1f1b", "zb-h1"):
        result = simulate(get_schedule(name, num_ranks=4, num_microbatches=8), unit)
        con.print(f"\n{name}, P=4, M=8, unit costs (F=B=W=1; fused B+W=2): "
                  f"bubble {result.bubble_rate:.1%}, idle / work {result.bubble_time / max(result.busy):.1%}")  # fmt: skip
        con.print(ascii_grid(result), markup=False)
    p, m = (8, 24)
    costs = CostModel.paper_model("1.5B", p)
    t_f, t_b, t_w, t_comm = PAPER_TIMES["1.5B"]  # the paper's measured per-rank times (ms)
    rows = compare_schedules(costs, num_stages=p, num_microbatches=m, include_torch=not quick)
    print_table(
        f"P={p}, M={m}, 1.5B costs (T_F={t_f} T_B={t_b} T_W={t_w} T_comm={t_comm} ms)",
        ["schedule", "from", "bubble", "peak mem vs 1F1B", "throughput vs 1F1B"],
        [[r.name, r.source, f"{r.result.bubble_rate:.2%}",
          f"{r.result.max_peak_memory_vs_1f1b:.2f}x", f"{r.throughput_vs_1f1b:.3f}x"]
         for r in rows if r.result is not None],
    )  # fmt: skip
    zb2p = next(r.throughput_vs_1f1b for r in rows if r.name == "zb-2p")
    assert zb2p is not None  # our schedules all build at P=8, M=24
    gain = zb2p - 1
    con.print(
        f"ZB-2p over 1F1B: {gain:+.1%} throughput (15-30% is the figure usually quoted for P=8, M=24)"
    )
    chosen = []
    for r in rows:
        if r.name in ("1f1b", "zb-h1", "zb-2p", "zb-v"):
            assert r.result is not None  # our schedules all build at P=8, M=24
            chosen.append(r.result)
    path = gantt_grid(chosen, Path(out_dir) / "pipeline_gantt.png")
    con.print(f"Gantt chart: {path}")
    return [path]
