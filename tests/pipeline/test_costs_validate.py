"""CostModel checks and validate()'s messages."""

from __future__ import annotations

import pytest

from nobubble.pipeline.actions import Schedule
from nobubble.pipeline.costs import PAPER_TIMES, CostModel, transformer_memory
from nobubble.pipeline.validate import ScheduleError, validate
from tests.pipeline.paper_table import ROWS, paper_costs


def test_paper_memory_model():
    mem = transformer_memory(hidden=2304, heads=24, seq=1024)
    assert mem.mem_f == 34 * 2304 + 5 * 24 * 1024
    assert mem.mem_b + mem.mem_w == mem.mem_f
    assert mem.mem_w == 32 * 2304


@pytest.mark.parametrize("model", ["1.5B", "6.2B", "14.6B", "28.3B"])
def test_paper_model_is_the_papers_first_row(model):
    """``CostModel.paper_model`` (``--model``) equals the paper table's first row of that model:
    its measured times (smallest m) and its shape, read from the CSV."""
    row = next(r for r in ROWS if r["model"] == model)
    assert PAPER_TIMES[model] == tuple(float(row[k]) for k in ("T_F_ms", "T_B_ms", "T_W_ms",
                                                                "T_comm_ms"))  # fmt: skip
    assert CostModel.paper_model(model, int(row["p"])) == paper_costs(row)


def test_paper_model_names_the_choices():
    with pytest.raises(ValueError, match=r"model='1B' .* choose from 1.5B, 6.2B, 14.6B, 28.3B"):
        CostModel.paper_model("1B", 8)


def test_from_rank_costs_splits_over_chunks():
    c = CostModel.from_rank_costs(2, num_chunks=2, t_f=[4.0, 8.0], t_b=2.0, t_w=2.0, mem_f=4.0)
    assert c.t_f == (2.0, 4.0, 2.0, 4.0)
    assert c.mem_f == (2.0,) * 4 and c.mem_b == (1.0,) * 4


def test_from_settings_defaults_to_the_papers_model_and_takes_overrides():
    """Against the paper's own rows (:meth:`CostModel.paper_model`) and a shape given by hand."""
    assert CostModel.from_settings(4, model="6.2B") == CostModel.paper_model("6.2B", 4)
    times = dict(zip(("t_f", "t_b", "t_w", "t_comm"), PAPER_TIMES["1.5B"]))
    mem = transformer_memory(hidden=64, heads=4, seq=8)
    got = CostModel.from_settings(2, t_f=[3.0, 5.0], t_comm=0.5, hidden=64, heads=4, seq=8)
    assert got == CostModel.from_rank_costs(
        2, t_f=(3.0, 5.0), t_b=1.0, t_w=1.0, t_comm=0.5,
        mem_f=mem.mem_f, mem_b=mem.mem_b, mem_w=mem.mem_w,
    )  # fmt: skip
    assert CostModel.from_settings(2, model="1.5B", t_w=2.0).t_w == (2.0, 2.0)
    assert CostModel.from_settings(2, model="1.5B").t_f == (times["t_f"],) * 2
    assert CostModel.from_settings(1, mem_f=4.0, mem_w=1.0).mem_b == (3.0,)


@pytest.mark.parametrize(
    ("kwargs", "msg"),
    [
        ({"model": "1B"}, "model='1B' is not one of the paper's models"),
        ({"hidden": 64, "mem_f": 2.0}, "not both"),
        ({"hidden": 64}, r"give all three \(hidden=64, heads=None, seq=None\)"),
        ({"mem_w": 1.0}, "mem_b=None/mem_w=1.0 need mem_f"),
        ({"mem_f": 1.0, "mem_b": 1.0, "mem_w": 0.5}, "mem_w = 1.5 on rank 0 frees more than"),
        ({"t_f": [1.0, 2.0, 3.0]}, "t_f has 3 entries"),
    ],
)
def test_from_settings_refuses_contradictions(kwargs, msg):
    with pytest.raises(ValueError, match=msg):
        CostModel.from_settings(2, **kwargs)


@pytest.mark.parametrize(
    ("kwargs", "msg"),
    [
        ({"t_f": 0.0}, r"t_f\[0\]=0.0 must be finite and > 0"),
        ({"t_b": -1.0}, r"t_b\[0\]=-1.0"),
        ({"t_comm": -0.1}, "t_comm=-0.1"),
        ({"mem_f": float("nan")}, "mem_f"),
    ],
)
def test_bad_costs(kwargs, msg):
    with pytest.raises(ValueError, match=msg):
        CostModel.uniform(2, **kwargs)


def test_bad_sizes():
    with pytest.raises(ValueError, match="num_stages=0"):
        CostModel.uniform(0)
    with pytest.raises(ValueError, match="one per stage"):
        CostModel(t_f=[1, 1], t_b=[1], t_w=[1, 1], mem_f=[1, 1], mem_b=[1, 1], mem_w=[1, 1])


@pytest.mark.parametrize(
    ("rows", "msg"),
    [
        ([["0F0"], ["1F0", "1B0"]], "stage 0 microbatch 0 has no backward"),
        ([["0F0", "0B0", "0B0"], ["1F0", "1B0"]], "0B0 appears 2 times"),
        ([["0F0", "0I0"], ["1F0", "1I0", "1W0"]], r"0I0 has no W; add 0W0"),
        ([["0F0", "0W0"], ["1F0", "1B0"]], "0W0 has no input-grad backward"),
        ([["0F0", "0B0", "0I0", "0W0"], ["1F0", "1B0"]], "both a fused backward"),
        ([["0B0", "0F0"], ["1F0", "1B0"]], r"rank 0: 0B0 waits for B of stage 1 microbatch 0"),
        ([["0F0", "0I0", "0W0"], ["1F0", "1W0", "1I0"]], r"1W0 waits for B of stage 1"),
    ],
)
def test_validate_names_the_action(rows, msg):
    sched = Schedule.from_rank_actions(rows)
    with pytest.raises(ScheduleError, match=msg):
        validate(sched)


def test_cross_rank_cycle_reported_for_every_stuck_rank():
    # rank 0 waits for a gradient that needs microbatch 1's forward, which rank 0 holds back
    rows = [["0F0", "0B0", "0F1", "0B1"], ["1F1", "1B1", "1F0", "1B0"]]
    with pytest.raises(ScheduleError, match=r"rank 0: 0B0 .*; rank 1: 1F1 waits for F of stage 0"):
        validate(Schedule.from_rank_actions(rows))


def test_a_measured_fused_backward_time_replaces_t_b_plus_t_w() -> None:
    from nobubble.pipeline.actions import Action, Op

    split = CostModel.uniform(2, t_f=1.0, t_b=1.0, t_w=1.0)
    measured = CostModel(t_f=(1.0, 1.0), t_b=(1.0, 1.0), t_w=(1.0, 1.0), mem_f=(1.0, 1.0),
                         mem_b=(0.5, 0.5), mem_w=(0.5, 0.5), t_bw=(1.5, 1.25))  # fmt: skip
    assert split.duration(Action(1, Op.BW, 0)) == 2.0
    assert measured.duration(Action(1, Op.BW, 0)) == 1.25
    assert measured.duration(Action(1, Op.B, 0)) == 1.0  # B and W keep their own times
    with pytest.raises(ValueError, match=r"t_bw\[0\]=0.0 must be finite and > 0"):
        CostModel(t_f=(1.0,), t_b=(1.0,), t_w=(1.0,), mem_f=(1.0,), mem_b=(0.5,),
                  mem_w=(0.5,), t_bw=(0.0,))  # fmt: skip


def test_a_measured_fused_backward_is_split_over_chunks_like_the_other_times() -> None:
    from nobubble.pipeline.actions import Action, Op

    ranks = CostModel(t_f=(2.0, 2.0), t_b=(2.0, 2.0), t_w=(2.0, 2.0), mem_f=(1.0, 1.0),
                      mem_b=(0.5, 0.5), mem_w=(0.5, 0.5), t_bw=(3.0, 2.5))  # fmt: skip
    v = ranks.for_stages([0, 1, 1, 0])  # two chunks per rank, a V
    assert v.t_bw == (1.5, 1.25, 1.25, 1.5)
    assert v.duration(Action(2, Op.BW, 0)) == 1.25
