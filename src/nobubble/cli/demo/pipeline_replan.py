"""``nobubble demo`` step for re-planning: rank 1 turns 3x slow mid-run, layers move off it.

Two local gloo ranks train 12 blocks and a head with ZB-H1 through a
:class:`~nobubble.pipeline.runtime.elastic.Replanner` (:func:`nobubble.bench.pp_replan.run_replan`,
the run ``benchmarks/pp_replan.py`` measures); from step 3 rank 1 really runs 3 times slower.
Prints each step's time and cut and draws them (``pipeline/replan_steps.png``).
"""

from __future__ import annotations

from pathlib import Path

from nobubble.cli.util import print_table


def run(out_dir: Path, quick: bool) -> list[Path]:
    from nobubble.bench.pp_replan import ReplanSetup, plot_replan, run_replan

    setup = ReplanSetup(steps=8 if quick else 12, timeout_s=300)
    h = run_replan(setup)
    print_table(
        f"ZB-H1 on 2 ranks, rank 1 {setup.factor:g}x slow from step {setup.start}",
        ["step", "step ms", "layers per rank", "re-planned after it"],
        [[s, f"{ms:.0f}", str(tuple(sizes)), "yes" if s in h.replanned_at else ""]
         for s, (ms, sizes) in enumerate(zip(h.step_ms, h.sizes, strict=True))],
    )  # fmt: skip
    png = Path(out_dir) / "pipeline" / "replan_steps.png"
    png.parent.mkdir(parents=True, exist_ok=True)
    return [plot_replan(h, setup, png)]
