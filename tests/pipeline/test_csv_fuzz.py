"""Schedule.from_csv on text nobody should write: it reads a schedule or raises ValueError.

Whatever the text (random characters, random CSV-like tokens, or a registry schedule's CSV
with a few random edits), ``from_csv`` either returns a schedule that round-trips through
``to_csv`` / ``from_csv`` unchanged, or raises ``ValueError`` (``ScheduleFormatError``) -
never ``IndexError``, ``KeyError``, ``csv.Error`` or the like.

The fuzzing found three faults, fixed since and pinned below: a carriage return not followed
by a line feed (old Mac line ends, ``"0F0\r0F1"``) and a cell longer than the csv module's
field limit (131072 characters) raised ``_csv.Error``, and a stage index of ``10**k`` made
``from_csv`` list the ``10**k - 1`` stages that have no actions (memory and time in
``10**k``).
"""

from __future__ import annotations

import pytest
from hypothesis import event, given
from hypothesis import strategies as st

from nobubble.pipeline.actions import Schedule
from tests.pipeline.registry_schedules import valid_schedules

TOKENS = st.one_of(
    st.integers(0, 12).map(str),
    st.sampled_from(["99999", "1000000000", "\r"]),
    st.sampled_from(["F", "I", "W", "B", "X", ",", ",,", "\n", "\r\n", " ", "\t", '"',
                     "(", ")", ";", "OVERLAP_F_B", "REDUCE_GRAD", "UNSHARD", "SEND_F", "RECV_B",
                     "-", "\x00", "\u0663", "\uff11", "é"]),
)  # fmt: skip
csv_like_texts = st.lists(TOKENS, max_size=40).map("".join)


@st.composite
def edited_csvs(draw: st.DrawFn) -> str:
    """A registry schedule's CSV after one to three random edits of its characters, cells
    or lines."""
    text = draw(valid_schedules()).to_csv()
    for _ in range(draw(st.integers(1, 3))):
        edit = draw(st.sampled_from(["delete", "insert", "lines", "cells"]))
        if edit in ("delete", "insert"):
            start = draw(st.integers(0, len(text)))
            end = draw(st.integers(start, min(len(text), start + 4)))
            insert = draw(TOKENS) if edit == "insert" else ""
            text = text[:start] + insert + text[end:]
        else:
            sep = "\n" if edit == "lines" else ","
            parts = text.split(sep)
            i, j = (draw(st.integers(0, len(parts) - 1)) for _ in range(2))
            how = draw(st.sampled_from(["swap", "drop", "repeat"]))
            if how == "swap":
                parts[i], parts[j] = parts[j], parts[i]
            elif how == "drop":
                del parts[i]
            else:
                parts.insert(j, parts[i])
            text = sep.join(parts)
    return text


def _reads_or_refuses(text: str) -> None:
    try:
        sched = Schedule.from_csv(text)
    except ValueError:
        event("refused")
        return
    event("read")
    again = Schedule.from_csv(sched.to_csv())
    assert again == sched
    assert again.to_csv() == sched.to_csv()


@given(st.text(max_size=60))
def test_random_text_reads_or_raises_value_error(text: str) -> None:
    _reads_or_refuses(text)


@given(csv_like_texts)
def test_random_csv_tokens_read_or_raise_value_error(text: str) -> None:
    _reads_or_refuses(text)


@given(edited_csvs())
def test_an_edited_schedule_csv_reads_or_raises_value_error(text: str) -> None:
    _reads_or_refuses(text)


@given(valid_schedules())
def test_a_registry_schedules_csv_reads_back_equal(sched: Schedule) -> None:
    read = Schedule.from_csv(sched.to_csv(), num_microbatches=sched.num_microbatches)
    assert read == sched.renamed("imported")


@pytest.mark.parametrize("text", ["\r0", "0F0,0I0,0W0\r1F0,1I0,1W0"])
def test_a_lone_carriage_return_raises_value_error(text: str) -> None:
    with pytest.raises(ValueError, match="CSV line 1: .*expected rows of cells"):
        Schedule.from_csv(text)


def test_a_cell_over_the_csv_field_limit_raises_value_error() -> None:
    with pytest.raises(ValueError, match="field larger than field limit"):
        Schedule.from_csv("0F0," + "x" * 200_000)


def test_a_huge_stage_index_names_a_few_missing_stages_at_once() -> None:
    with pytest.raises(ValueError, match=r"stages 1, 2, 3, 4, 5 and 999,999,993 more have no"):
        Schedule.from_csv("0F0,999999999F0")
