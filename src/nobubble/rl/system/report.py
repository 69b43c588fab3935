"""Pictures and traces of RL runs of either producer: a Chrome trace of the stages
(:func:`write_trace`), curves, staleness and idle ratios (:func:`plot_runs`), a table row
(:func:`summary_row`)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from nobubble.files import save_figure
from nobubble.rl.system.result import STAGES, RunResult, span_events
from nobubble.trace import write_chrome_trace

__all__ = ["write_trace", "plot_runs", "summary_row", "SUMMARY_COLUMNS"]


def write_trace(result: RunResult, path: str | Path) -> Path:
    """Write the per-stage busy/idle timeline of ``result`` as a Chrome trace."""
    return write_chrome_trace(
        path, span_events(result.spans, result.t0), rank_names=dict(enumerate(STAGES))
    )


_SUMMARY: tuple[tuple[str, Callable[[RunResult], Any]], ...] = (
    ("steps", lambda r: r.steps),
    ("wall s", lambda r: r.wall_s),
    ("samples/s", lambda r: r.samples_per_s),
    ("acc start", lambda r: r.initial_accuracy),
    ("acc final", lambda r: r.final_accuracy),
    ("stale max", lambda r: r.staleness_max),
    ("idle gen", lambda r: f"{r.idle_ratio['rollout']:.0%}"),
    ("idle train", lambda r: f"{r.idle_ratio['trainer']:.0%}"),
    ("dropped", lambda r: sum(r.ledger.dropped.values()) - r.ledger.dropped.get("unfinished", 0)),
)
SUMMARY_COLUMNS = ["run", *(column for column, _ in _SUMMARY)]


def summary_row(label: str, r: RunResult) -> list[Any]:
    """The cells of :data:`SUMMARY_COLUMNS` for the task run ``r``."""
    return [label, *(cell(r) for _, cell in _SUMMARY)]


def plot_runs(results: Mapping[str, RunResult], path: str | Path, *, title: str = "") -> Path:
    """One PNG/SVG of runs by label: the learning curve against wall-clock and against
    progress (a task's accuracy against learner updates; an env run's return against env
    steps, the mean of its last 20 training episodes as a line and its greedy evaluations as
    dots, its target dashed), the staleness histogram and each stage's or role's idle ratio."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig, ((ax_t, ax_s), (ax_h, ax_i)) = plt.subplots(2, 2, figsize=(11, 7.5))
    env = any(r.env is not None for r in results.values())
    for label, r in results.items():
        for ax, x in ((ax_t, "wall_s"), (ax_s, "env_steps" if env else "step")):
            _draw_curve(ax, r, x, label)
    progress = "environment steps" if env else "trainer step"
    targets = {r.target_return for r in results.values() if r.target_return is not None}
    for ax, xl in ((ax_t, "wall-clock (s)"), (ax_s, progress)):
        for target in targets:
            ax.axhline(target, ls="--", color="grey", lw=1, label=f"target {target:g}")
        ax.set_xlabel(xl)
        ax.set_ylabel("episode return" if env else "exact-match accuracy (eval set)")
        if not env:
            ax.set_ylim(-0.02, 1.02)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    _draw_bars(ax_h, ax_i, results)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    save_figure(fig, path, dpi=110)
    plt.close(fig)
    return path


def _draw_curve(ax: Any, r: RunResult, x: str, label: str) -> None:
    """``r``'s curve on ``ax`` against the :class:`CurvePoint` field ``x``."""
    if r.env is None:
        points = [p for p in r.curve if p.accuracy is not None]
        ax.plot([getattr(p, x) for p in points], [p.accuracy for p in points], marker="o", ms=3,
                label=label)  # fmt: skip
        return
    train = [p for p in r.curve if p.train_return is not None]
    evals = [p for p in r.curve if p.eval_return is not None]
    line = ax.plot([getattr(p, x) for p in train], [p.train_return for p in train], lw=1.2,
                   label=label)[0]  # fmt: skip
    ax.plot([getattr(p, x) for p in evals], [p.eval_return for p in evals], "o", ms=5,
            color=line.get_color())  # fmt: skip


def _draw_bars(ax_h: Any, ax_i: Any, results: Mapping[str, RunResult]) -> None:
    """The staleness histograms on ``ax_h`` and the idle ratios on ``ax_i``, side by side."""
    width = 0.8 / max(1, len(results))
    max_lag = max((r.staleness_max for r in results.values()), default=0)
    stages = list(dict.fromkeys(s for r in results.values() for s in r.idle_ratio))
    for i, (label, r) in enumerate(results.items()):
        total = max(1, sum(r.staleness_hist.values()))
        xs = list(range(max_lag + 1))
        ax_h.bar([x + i * width for x in xs], [r.staleness_hist.get(x, 0) / total for x in xs],
                 width=width, label=label)  # fmt: skip
        ax_i.bar([j + i * width for j in range(len(stages))],
                 [r.idle_ratio.get(s, 0.0) for s in stages], width=width, label=label)  # fmt: skip
    ax_h.set_xlabel("staleness (trainer version - sample version)")
    ax_h.set_ylabel("share of trained samples")
    ax_h.legend(fontsize=8)
    ax_i.set_xticks([j + width * (len(results) - 1) / 2 for j in range(len(stages))], stages)
    ax_i.set_ylabel("idle ratio")
    ax_i.set_ylim(0, 1)
    ax_i.legend(fontsize=8)
