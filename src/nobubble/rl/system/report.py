"""Pictures and traces of RL runs: per-stage timelines, curves, staleness histograms.

- :func:`write_trace`: the stages' busy spans as a Chrome trace (one process per stage; open
  it in Perfetto to see where each stage waits).
- :func:`plot_runs`: accuracy against wall-clock and against step, the staleness histogram
  and the idle ratio per stage, one colour per run (matplotlib, Agg backend).
- :func:`summary_row`: the numbers a table shows for one run.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from nobubble.files import save_figure
from nobubble.rl.system.result import RunResult
from nobubble.trace import Event, write_chrome_trace

__all__ = ["STAGES", "trace_events", "write_trace", "plot_runs", "summary_row", "SUMMARY_COLUMNS"]

STAGES = ("rollout", "reward", "trainer")


def trace_events(result: RunResult) -> list[Event]:
    """The run's spans as trace events (microseconds since the run started)."""
    events = []
    for s in result.spans:
        if s.end_s < result.t0:
            continue
        start = max(s.start_s, result.t0)
        events.append(
            Event(
                name=s.name,
                cat=s.stage,
                rank=STAGES.index(s.stage),
                start_us=(start - result.t0) * 1e6,
                dur_us=max(0.0, s.end_s - start) * 1e6,
                args={k: v for k, v in s.args.items() if isinstance(v, int | float | str)},
            )
        )
    events.sort(key=lambda e: e.start_us)
    return events


def write_trace(result: RunResult, path: str | Path) -> Path:
    """Write the per-stage busy/idle timeline of ``result`` as a Chrome trace."""
    return write_chrome_trace(
        path, trace_events(result), rank_names={i: s for i, s in enumerate(STAGES)}
    )


SUMMARY_COLUMNS = [
    "run",
    "steps",
    "wall s",
    "samples/s",
    "acc start",
    "acc final",
    "stale max",
    "idle gen",
    "idle train",
    "dropped",
]


def summary_row(label: str, r: RunResult) -> list[Any]:
    dropped = sum(r.ledger.dropped.values()) - r.ledger.dropped.get("unfinished", 0)
    return [
        label,
        r.steps,
        r.wall_s,
        r.samples_per_s,
        r.initial_accuracy,
        r.final_accuracy,
        r.staleness_max,
        f"{r.idle_ratio['rollout']:.0%}",
        f"{r.idle_ratio['trainer']:.0%}",
        dropped,
    ]


def plot_runs(results: Mapping[str, RunResult], path: str | Path, *, title: str = "") -> Path:
    """Accuracy vs wall-clock and vs step, staleness histogram, idle ratios; one PNG/SVG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig, axes = plt.subplots(2, 2, figsize=(11, 7.5))
    (ax_t, ax_s), (ax_h, ax_i) = axes
    labels = list(results)
    for label, r in results.items():
        ax_t.plot(
            [p.wall_s for p in r.curve],
            [p.accuracy for p in r.curve],
            marker="o",
            ms=3,
            label=label,
        )
        ax_s.plot(
            [p.step for p in r.curve], [p.accuracy for p in r.curve], marker="o", ms=3, label=label
        )
    for ax, xl in ((ax_t, "wall-clock (s)"), (ax_s, "trainer step")):
        ax.set_xlabel(xl)
        ax.set_ylabel("exact-match accuracy (eval set)")
        ax.set_ylim(-0.02, 1.02)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    width = 0.8 / max(1, len(labels))
    max_lag = max((max(r.staleness_hist, default=0) for r in results.values()), default=0)
    for i, (label, r) in enumerate(results.items()):
        total = max(1, sum(r.staleness_hist.values()))
        xs = list(range(max_lag + 1))
        ax_h.bar(
            [x + i * width for x in xs],
            [r.staleness_hist.get(x, 0) / total for x in xs],
            width=width,
            label=label,
        )
    ax_h.set_xlabel("staleness (trainer version - sample version)")
    ax_h.set_ylabel("share of trained samples")
    ax_h.legend(fontsize=8)
    for i, (label, r) in enumerate(results.items()):
        ax_i.bar(
            [j + i * width for j in range(len(STAGES))],
            [r.idle_ratio[s] for s in STAGES],
            width=width,
            label=label,
        )
    ax_i.set_xticks([j + width * (len(labels) - 1) / 2 for j in range(len(STAGES))], STAGES)
    ax_i.set_ylabel("idle ratio")
    ax_i.set_ylim(0, 1)
    ax_i.legend(fontsize=8)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    save_figure(fig, path, dpi=110)
    plt.close(fig)
    return path
