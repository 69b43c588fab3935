"""Op / Action / Schedule: torch's text form, CSV round trips, shape checks."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nobubble.pipeline.actions import Action, Op, Schedule, ScheduleFormatError


def test_action_prints_like_torch():
    assert str(Action(2, Op.F, 0)) == "2F0"
    assert str(Action(2, Op.B, 0)) == "2I0"
    assert str(Action(2, Op.W, 13)) == "2W13"
    assert str(Action(0, Op.BW, 7)) == "0B7"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2F0", Action(2, Op.F, 0)),
        ("2I0", Action(2, Op.B, 0)),
        ("11W3", Action(11, Op.W, 3)),
        (" 0B12 ", Action(0, Op.BW, 12)),
    ],
)
def test_parse(text, expected):
    assert Action.parse(text) == expected


@pytest.mark.parametrize("bad", ["", "F0", "2X0", "2F", "-1F0", "2F0x"])
def test_parse_rejects(bad):
    with pytest.raises(ScheduleFormatError, match="cannot read action"):
        Action.parse(bad)


@given(st.integers(0, 500), st.sampled_from(list(Op)), st.integers(0, 5000))
def test_parse_inverts_str(stage, op, mb):
    a = Action(stage, op, mb)
    assert Action.parse(str(a)) == a


def _two_rank_schedule() -> Schedule:
    rows = [["0F0", "0F1", "0I0", "0W0", "0I1", "0W1"], ["1F0", "1I0", "1F1", "1I1", "1W0", "1W1"]]
    return Schedule.from_rank_actions(rows, name="t")


def test_from_rank_actions_infers_shape():
    s = _two_rank_schedule()
    assert (s.num_ranks, s.num_stages, s.num_chunks, s.num_microbatches) == (2, 2, 1, 2)
    assert s.stage_to_rank == (0, 1)
    assert s.uses_split_backward
    assert s.num_actions == 12


def test_csv_round_trip_and_torch_text():
    s = _two_rank_schedule()
    text = s.to_csv()
    assert text.splitlines()[0] == "0F0,0F1,0I0,0W0,0I1,0W1"
    back = Schedule.from_csv(text, name="t")
    assert back == s


def test_csv_skips_idle_and_noncompute_cells():
    text = "0F0,,0B0,0REDUCE_GRAD\n,1F0,1B0\n"
    s = Schedule.from_csv(text)
    assert s.rank_actions == (
        (Action(0, Op.F, 0), Action(0, Op.BW, 0)),
        (Action(1, Op.F, 0), Action(1, Op.BW, 0)),
    )


def test_interleaved_stage_map_inferred():
    rows = [["0F0", "2F0", "2B0", "0B0"], ["1F0", "3F0", "3B0", "1B0"]]
    s = Schedule.from_rank_actions(rows)
    assert s.stage_to_rank == (0, 1, 0, 1)
    assert s.stages_of(0) == (0, 2) and s.num_chunks == 2


def test_stage_on_two_ranks_rejected():
    with pytest.raises(ScheduleFormatError, match="stage 0 appears on ranks 0 and 1"):
        Schedule.from_rank_actions([["0F0"], ["0F1"]])


def test_action_on_wrong_rank_rejected():
    with pytest.raises(ScheduleFormatError, match="action 1F0 is on rank 0"):
        Schedule("x", 1, (0, 1), ((Action(1, Op.F, 0),), ()))


def test_microbatch_out_of_range_rejected():
    with pytest.raises(ScheduleFormatError, match="outside stages"):
        Schedule("x", 1, (0,), ((Action(0, Op.F, 3),),))


def test_bad_csv_names_line():
    with pytest.raises(ScheduleFormatError, match="CSV line 2"):
        Schedule.from_csv("0F0\n1Q0\n")
    with pytest.raises(ScheduleFormatError, match="no actions"):
        Schedule.from_csv("\n\n")


def test_read_csv_reads_a_file_and_names_it_in_every_error(tmp_path):
    sched = Schedule.from_csv("0F0,0F1,0B0,0B1\n1F0,1B0,1F1,1B1\n", name="x")
    (tmp_path / "mine.csv").write_text(sched.to_csv())
    back = Schedule.read_csv(tmp_path / "mine.csv")
    assert back.rank_actions == sched.rank_actions and back.name == "mine"
    (tmp_path / "bad.csv").write_text("0F0\n1Q0\n")
    (tmp_path / "bin.csv").write_bytes(b"\xff\xfe0F0")
    for name, needle in (("bad.csv", "CSV line 2"), ("bin.csv", "not UTF-8 text"),
                         ("gone.csv", "no such file")):  # fmt: skip
        with pytest.raises(ScheduleFormatError, match=f"^{tmp_path / name}: {needle}"):
            Schedule.read_csv(tmp_path / name)
