"""A measured step next to the simulator's prediction, as two Gantt charts on one time axis."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from nobubble.files import save_figure
from nobubble.pipeline.plot import OP_COLORS
from nobubble.pipeline.runtime.executor import WAIT, RankResult
from nobubble.pipeline.simulate import SimResult

if TYPE_CHECKING:
    from nobubble.pipeline.actions import Op

__all__ = ["plot_measured_vs_simulated"]


def _bars(ax, rows: list[list[tuple[float, float, str, Op]]], title: str) -> None:
    for rank, bars in enumerate(rows):
        for start, dur, label, op in bars:
            ax.broken_barh([(start, dur)], (rank - 0.4, 0.8), facecolors=OP_COLORS[op],
                           edgecolor="white", linewidth=0.4)  # fmt: skip
            ax.text(start + dur / 2, rank, label, ha="center", va="center", fontsize=6,
                    color="white", clip_on=True)  # fmt: skip
    ax.set_yticks(range(len(rows)), [f"rank {r}" for r in range(len(rows))])
    ax.invert_yaxis()
    ax.set_title(title, fontsize=9)


def plot_measured_vs_simulated(
    path: str | Path, results: Sequence[RankResult], sim: SimResult | None, *, step: int
) -> Path:
    """Draw ``step`` of a run (top) and, given ``sim``, the simulated schedule (bottom), in ms
    from the step's first op. The file type follows the suffix (.png, .svg)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path = Path(path)
    if path.suffix.lower() not in (".png", ".svg", ".pdf"):
        raise ValueError(f"plot file {path} must end in .png, .svg or .pdf")
    sched = sim.schedule if sim is not None else None
    evs = [[e for e in r.events if e.args.get("step") == step and e.cat != WAIT] for r in results]
    t0 = min(e.start_us for row in evs for e in row)
    measured = [
        [((e.start_us - t0) / 1e3, e.dur_us / 1e3, str(e.args["microbatch"]), _op(e.cat))
         for e in row]
        for row in evs
    ]  # fmt: skip
    panels = [(measured, f"measured step {step}")]
    if sim is not None:
        s0 = min(min(s) for s in sim.start if s)
        assert sched is not None  # sim.schedule
        simulated = [
            [(s - s0, e - s, str(a.microbatch), a.op)
             for a, s, e in zip(acts, sim.start[r], sim.end[r], strict=True)]
            for r, acts in enumerate(sched.rank_actions)
        ]  # fmt: skip
        panels.append((simulated, f"simulated from profiled costs (bubble {sim.bubble_rate:.1%})"))
    p = len(results)
    fig, axes = plt.subplots(len(panels), 1, sharex=True, squeeze=False,
                             figsize=(12, 0.6 + 0.5 * p * len(panels) + 0.6 * len(panels)))  # fmt: skip
    for ax, (rows, title) in zip(axes[:, 0], panels, strict=True):
        _bars(ax, rows, title)
    from matplotlib.patches import Patch

    from nobubble.pipeline.actions import Op

    names = {Op.F: "F", Op.B: "B (input grad)", Op.W: "W (weight grad)", Op.BW: "B+W fused"}
    used = {op for rows, _ in panels for bars in rows for *_, op in bars}
    handles = [Patch(color=OP_COLORS[op], label=names[op]) for op in Op if op in used]
    axes[0, 0].legend(handles=handles, loc="lower right", bbox_to_anchor=(1.0, 1.0),
                      ncol=len(handles), fontsize=7, frameon=False)  # fmt: skip
    axes[-1, 0].set_xlabel("time (ms)")
    fig.tight_layout()
    save_figure(fig, path, dpi=130, bbox_inches="tight")
    plt.close(fig)
    return path


def _op(cat: str) -> Op:
    from nobubble.pipeline.actions import Op

    return Op(cat)
