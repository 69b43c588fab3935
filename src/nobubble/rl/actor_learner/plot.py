"""The architectures side by side: return against wall-clock and against env steps.

:func:`plot_curves` draws the learning curves of :class:`~nobubble.rl.system.result.
RunResult` s (one line per run, the target as a dashed line) into one PNG or SVG, written
atomically (matplotlib, Agg backend).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from nobubble.files import save_figure
from nobubble.rl.system.result import RunResult

__all__ = ["plot_curves"]


def plot_curves(results: Sequence[RunResult], path: str | Path) -> Path:
    """Two panels, return vs seconds and vs env steps: per run, the mean of its last 20
    training episodes as a line and its greedy evaluations as dots."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (by_time, by_steps) = plt.subplots(1, 2, figsize=(11, 4))
    for r in results:
        train = [p for p in r.curve if p.train_return is not None]
        evals = [p for p in r.curve if p.eval_return is not None]
        label = f"{r.arch} ({r.env_steps_per_s:,.0f} steps/s)"
        for ax, x in ((by_time, "wall_s"), (by_steps, "env_steps")):
            line = ax.plot([getattr(p, x) for p in train], [p.train_return for p in train],
                           lw=1.2, label=label)[0]  # fmt: skip
            ax.plot([getattr(p, x) for p in evals], [p.eval_return for p in evals], "o",
                    ms=5, color=line.get_color())  # fmt: skip
    target = results[0].target_return if results else None
    for ax, xlabel in ((by_time, "wall-clock (s)"), (by_steps, "environment steps")):
        if target is not None:
            ax.axhline(target, ls="--", color="grey", lw=1, label=f"target {target:g}")
        ax.set_xlabel(xlabel)
        ax.set_ylabel("episode return")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    if results:
        fig.suptitle(f"{results[0].env}, the same budget: lines, the mean of the last 20 training "
                     "episodes; dots, greedy evaluations")  # fmt: skip
    fig.tight_layout()
    out = save_figure(fig, path, dpi=110)
    plt.close(fig)
    return out
