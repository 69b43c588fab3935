"""Pictures of a schedule: the text grid, a Gantt chart (PNG/SVG), a Chrome trace.

- :func:`ascii_grid`: one row per rank, one cell per time slot, the op letter in busy slots
  and ``_`` in idle ones (``Rank 1: _ F F F B W B B ...``), as schedules are usually drawn on a whiteboard.
- :func:`gantt`: one row per rank, F / B / W / fused-backward boxes in four colours with
  the microbatch number inside, idle time left white; the title carries the bubble rate.
- :func:`frontier_plot`: bubble against peak activation memory, the Pareto set joined.
- :func:`trace_events` / :func:`write_trace`: the simulated timeline as
  :class:`nobubble.trace.Event` objects (1 time unit = 1 ms) for Perfetto.
"""

from __future__ import annotations

import math
from pathlib import Path

from nobubble.files import figure, pyplot_for
from nobubble.pipeline.actions import Op, Schedule
from nobubble.pipeline.costs import CostModel
from nobubble.pipeline.simulate import SimResult, simulate
from nobubble.trace import Event, write_chrome_trace

__all__ = [
    "ascii_grid",
    "gantt",
    "gantt_grid",
    "frontier_plot",
    "trace_events",
    "write_trace",
    "OP_COLORS",
    "sim_bars",
    "draw_bars",
    "op_legend",
]

OP_COLORS = {Op.F: "#4C72B0", Op.B: "#DD8452", Op.W: "#55A868", Op.BW: "#C44E52"}
_LETTER = {Op.F: "F", Op.B: "B", Op.W: "W", Op.BW: "B"}
_NAMES = {Op.F: "F forward", Op.B: "B input grad", Op.W: "W weight grad", Op.BW: "B+W fused"}


def ascii_grid(
    schedule: Schedule | SimResult, costs: CostModel | None = None, *, microbatches: bool = False
) -> str:
    """The text grid of a schedule (simulated with ``costs``, unit costs by default) or of
    an existing :class:`SimResult`. One cell is the shortest op's duration."""
    if isinstance(schedule, SimResult):
        result = schedule
    else:
        costs = costs or CostModel.uniform(schedule.num_ranks)
        result = simulate(schedule, costs)
    sched = result.schedule
    slot = min(
        e - s for ends, starts in zip(result.end, result.start) for s, e in zip(starts, ends)
    )
    t0 = min(min(s) for s in result.start if s)
    num_cells = math.ceil((result.makespan) / slot - 1e-9)
    width = 1 + (len(str(sched.num_microbatches - 1)) if microbatches else 0)
    lines = []
    for rank, acts in enumerate(sched.rank_actions):
        cells = ["_" * width] * num_cells
        for a, s, e in zip(acts, result.start[rank], result.end[rank]):
            first, last = round((s - t0) / slot), round((e - t0) / slot)
            label = _LETTER[a.op] + (str(a.microbatch) if microbatches else "")
            for k in range(first, min(last, num_cells)):
                cells[k] = label.ljust(width)
        lines.append(f"Rank {rank}: " + " ".join(cells).rstrip())
    return "\n".join(lines)


Bar = tuple[float, float, str, Op, float]
"""One box of a Gantt row: ``(start, duration, label, op, alpha)``."""


def sim_bars(result: SimResult) -> list[list[Bar]]:
    """Per rank, the boxes of ``result``'s timeline from its first op (the microbatch as
    label; a V or interleaved schedule's first chunk drawn stronger)."""
    sched, p = result.schedule, result.schedule.num_ranks
    t0 = min(min(s) for s in result.start if s)
    return [
        [(s - t0, e - s, str(a.microbatch), a.op,
          1.0 if sched.num_chunks == 1 else 0.6 + 0.4 * (a.stage // p == 0))
         for a, s, e in zip(acts, result.start[rank], result.end[rank], strict=True)]
        for rank, acts in enumerate(sched.rank_actions)
    ]  # fmt: skip


def draw_bars(ax, rows: list[list[Bar]], *, label_min: float = 0.0, linewidth: float = 0.4):
    """Draw one row per rank (rank 0 on top); boxes narrower than ``label_min`` get no label."""
    for rank, bars in enumerate(rows):
        for start, dur, label, op, alpha in bars:
            ax.broken_barh([(start, dur)], (rank - 0.4, 0.8), facecolors=OP_COLORS[op],
                           edgecolor="white", linewidth=linewidth, alpha=alpha)  # fmt: skip
            if label and dur >= label_min:
                ax.text(start + dur / 2, rank, label, ha="center", va="center", fontsize=6,
                        color="white", clip_on=True)  # fmt: skip
    ax.invert_yaxis()


def op_legend(ops) -> list:
    """Legend handles for the ops in ``ops``, in :class:`Op` order."""
    from matplotlib.patches import Patch

    used = set(ops)
    return [Patch(color=OP_COLORS[op], label=_NAMES[op]) for op in Op if op in used]


def gantt(
    result: SimResult,
    path: str | Path,
    *,
    title: str | None = None,
    time_unit: str = "ms",
) -> Path:
    """Draw ``result`` as a Gantt chart; the file type follows the suffix (.png, .svg)."""
    sched = result.schedule
    p = sched.num_ranks
    size = (min(18, 4 + 0.12 * sched.num_actions / p), 0.9 + 0.45 * p)
    with figure(path, figsize=size, dpi=130, bbox_inches="tight") as (_, ax):
        draw_bars(ax, sim_bars(result), label_min=result.makespan / 60)
        ax.set_yticks(range(p), [f"rank {r}" for r in range(p)])
        ax.set_xlim(0, result.makespan)
        ax.set_xlabel(f"time ({time_unit})")
        handles = op_legend(a.op for acts in sched.rank_actions for a in acts)
        ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.25 - 0.4 / p),
                  ncol=len(handles), fontsize=8, frameon=False)  # fmt: skip
        head = title or f"{sched.name}: p={p}, m={sched.num_microbatches}"
        ax.set_title(f"{head}   bubble {result.bubble_rate:.1%}, peak memory "
                     f"{result.max_peak_memory_vs_1f1b:.2f}x 1F1B", fontsize=10)  # fmt: skip
    return Path(path)


def trace_events(result: SimResult, *, us_per_unit: float = 1000.0) -> list[Event]:
    """Every simulated action as an Event (cost units taken as ms by default)."""
    sched = result.schedule
    events = []
    for rank, acts in enumerate(sched.rank_actions):
        for a, s, e in zip(acts, result.start[rank], result.end[rank]):
            events.append(Event(name=str(a), cat=a.op.value, rank=rank, start_us=s * us_per_unit,
                                dur_us=(e - s) * us_per_unit,
                                args={"stage": a.stage, "microbatch": a.microbatch}))  # fmt: skip
    return events


def write_trace(result: SimResult, path: str | Path) -> Path:
    """Write the simulated timeline as a Chrome trace (open in Perfetto)."""
    names = {r: f"rank {r} ({result.schedule.name})" for r in range(result.schedule.num_ranks)}
    return write_chrome_trace(path, trace_events(result), rank_names=names)


def gantt_grid(results: list[SimResult], path: str | Path, *, time_unit: str = "ms") -> Path:
    """Several schedules' Gantt charts stacked in one image, on one time axis."""
    if not results:
        raise ValueError("nothing to draw: no simulated schedule")
    heights = [r.schedule.num_ranks + 1.5 for r in results]
    horizon = max(r.makespan for r in results)
    with figure(path, len(results), 1, sharex=True, squeeze=False, rect=(0, 0, 1, 0.97),
                figsize=(14, 0.28 * sum(heights) + 1),
                gridspec_kw={"height_ratios": heights}) as (fig, axes):  # fmt: skip
        for ax, result in zip(axes[:, 0], results):
            rows = [[(s, d, "", op, 1.0) for s, d, _, op, _ in bars] for bars in sim_bars(result)]
            draw_bars(ax, rows, linewidth=0.2)
            ax.set_yticks([])
            ax.set_xlim(0, horizon)
            ax.set_title(f"{result.schedule.name}: bubble {result.bubble_rate:.1%}, makespan "
                         f"{result.makespan:.4g}, memory "
                         f"{result.max_peak_memory_vs_1f1b:.2f}x 1F1B",
                         fontsize=8, loc="left")  # fmt: skip
        axes[-1, 0].set_xlabel(f"time ({time_unit}); one row per rank, rank 0 on top")
        handles = op_legend(a.op for r in results for acts in r.schedule.rank_actions
                            for a in acts)  # fmt: skip
        fig.legend(handles=handles, loc="upper right", ncol=len(handles), fontsize=8,
                   frameon=False)  # fmt: skip
    return Path(path)


_SOURCE_MARKERS = {"nobubble": "o", "torch": "s", "ilp": "D"}


def frontier_plot(points, path: str | Path, *, title: str = "") -> Path:
    """Bubble rate against peak activation memory, one marker per schedule (its source by
    shape), the Pareto-optimal ones joined by a line. ``points``: a sequence of
    :class:`~nobubble.pipeline.frontier.FrontierPoint` (memory in rank units)."""
    pyplot_for(path)  # the suffix checked before the points
    drawn = [q for q in points if q.ok]
    if not drawn:
        raise ValueError("nothing to draw: no schedule was built")
    with figure(path, figsize=(8, 5), dpi=130) as (_, ax):
        _draw_frontier(ax, drawn, title)
    return Path(path)


def _draw_frontier(ax, drawn, title: str) -> None:
    for source in sorted({q.source for q in drawn}):
        group = [q for q in drawn if q.source == source]
        ax.scatter([q.peak_memory for q in group], [100 * q.bubble_rate for q in group],
                   marker=_SOURCE_MARKERS.get(source, "^"), label=source, alpha=0.8,
                   zorder=3)  # fmt: skip
    best = sorted((q for q in drawn if q.pareto), key=lambda q: q.peak_memory)
    ax.step([q.peak_memory for q in best], [100 * q.bubble_rate for q in best], where="post",
            color="#C44E52", linewidth=1.2, label="Pareto frontier", zorder=2)  # fmt: skip
    for q in drawn:
        ax.annotate(q.name, (q.peak_memory, 100 * q.bubble_rate), fontsize=6,
                    xytext=(3, 3), textcoords="offset points",
                    fontweight="bold" if q.pareto else "normal")  # fmt: skip
    ax.set_xlabel("peak activation memory per rank (microbatches of one rank's activations)")
    ax.set_ylabel("bubble rate (%)")
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
