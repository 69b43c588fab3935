"""Text grid, Gantt chart and trace of a simulated schedule."""

from __future__ import annotations

import pytest

from nobubble.pipeline.costs import CostModel
from nobubble.pipeline.plot import ascii_grid, gantt, gantt_grid, trace_events
from nobubble.pipeline.schedules import get_schedule
from nobubble.pipeline.simulate import simulate


def test_grid_counts_cells():
    p, m = 4, 8
    sched = get_schedule("zb-h1", num_stages=p, num_microbatches=m)
    rows = [line.split(": ")[1].split() for line in ascii_grid(sched).splitlines()]
    for r, cells in enumerate(rows):
        assert cells[:r] == ["_"] * r  # rank r waits r slots for its first input
        assert (cells.count("F"), cells.count("B"), cells.count("W")) == (m, m, m)
    # unit costs: every busy cell is one op, so the grid width is the makespan
    assert max(len(c) for c in rows) == simulate(sched, CostModel.uniform(p)).makespan


def test_grid_with_microbatch_ids():
    grid = ascii_grid(get_schedule("1f1b", num_stages=2, num_microbatches=2), microbatches=True)
    assert grid.splitlines()[0].split(": ")[1].split()[:2] == ["F0", "F1"]


@pytest.mark.parametrize("suffix", [".png", ".svg"])
def test_gantt_files(tmp_path, suffix):
    r = simulate(get_schedule("zb-v", num_stages=3, num_microbatches=6), CostModel.uniform(3))
    path = gantt(r, tmp_path / f"g{suffix}")
    head = path.read_bytes()[:200]
    assert head.startswith(b"\x89PNG") if suffix == ".png" else b"<svg" in head or b"<?xml" in head
    grid = gantt_grid([r, r], tmp_path / "all.png")
    assert grid.stat().st_size > 1000


def test_trace_events_match_timeline():
    r = simulate(get_schedule("zb-h2", num_stages=2, num_microbatches=3), CostModel.uniform(2))
    events = trace_events(r, us_per_unit=1.0)
    assert len(events) == r.schedule.num_actions
    for e in events:
        assert (e.start_us, e.end_us) == pytest.approx(r.timing(_action(e.name)))


def _action(name):
    from nobubble.pipeline.actions import Action

    return Action.parse(name)


def test_legend_names_every_op_drawn_once():
    from nobubble.pipeline.actions import Op
    from nobubble.pipeline.plot import op_legend

    handles = op_legend(op for op in (Op.W, Op.F, Op.B, Op.F))  # a generator, read once
    assert [h.get_label() for h in handles] == ["F forward", "B input grad", "W weight grad"]
