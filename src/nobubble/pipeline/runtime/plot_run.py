"""A measured step next to the simulator's prediction, as two Gantt charts on one time axis."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from nobubble.files import figure, pyplot_for
from nobubble.pipeline.actions import Op
from nobubble.pipeline.plot import draw_bars, op_legend, sim_bars
from nobubble.pipeline.runtime.executor import WAIT, RankResult
from nobubble.pipeline.simulate import SimResult

__all__ = ["plot_measured_vs_simulated"]


def plot_measured_vs_simulated(
    path: str | Path, results: Sequence[RankResult], sim: SimResult | None, *, step: int
) -> Path:
    """Draw ``step`` of a run (top) and, given ``sim``, the simulated schedule (bottom), in ms
    from the step's first op. The file type follows the suffix (.png, .svg)."""
    pyplot_for(path)  # the suffix checked before the events
    evs = [[e for e in r.events if e.args.get("step") == step and e.cat != WAIT] for r in results]
    t0 = min(e.start_us for row in evs for e in row)
    measured = [
        [((e.start_us - t0) / 1e3, e.dur_us / 1e3, str(e.args["microbatch"]), Op(e.cat), 1.0)
         for e in row]
        for row in evs
    ]  # fmt: skip
    panels = [(measured, f"measured step {step}")]
    if sim is not None:
        title = f"simulated from profiled costs (bubble {sim.bubble_rate:.1%})"
        panels.append(([[b[:4] + (1.0,) for b in bars] for bars in sim_bars(sim)], title))
    p = len(results)
    size = (12, 0.6 + 0.5 * p * len(panels) + 0.6 * len(panels))
    with figure(path, len(panels), 1, sharex=True, squeeze=False, figsize=size, dpi=130,
                bbox_inches="tight") as (_, axes):  # fmt: skip
        for ax, (rows, title) in zip(axes[:, 0], panels, strict=True):
            draw_bars(ax, rows)
            ax.set_yticks(range(len(rows)), [f"rank {r}" for r in range(len(rows))])
            ax.set_title(title, fontsize=9)
        handles = op_legend(bar[3] for rows, _ in panels for bars in rows for bar in bars)
        axes[0, 0].legend(handles=handles, loc="lower right", bbox_to_anchor=(1.0, 1.0),
                          ncol=len(handles), fontsize=7, frameon=False)  # fmt: skip
        axes[-1, 0].set_xlabel("time (ms)")
    return Path(path)
