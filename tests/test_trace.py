"""Traces: per-rank timelines merged in time order, exported to Chrome format and read back."""

from __future__ import annotations

import json
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nobubble.trace import (
    Event,
    TraceFormatError,
    merge_timelines,
    merge_trace_files,
    read_chrome_trace,
    summarize,
    to_chrome_trace,
    write_chrome_trace,
)


def _timeline(rank, n, rng):
    t, out = rng.uniform(0, 50), []
    for i in range(n):
        d = rng.uniform(1, 10)
        out.append(Event(f"op{i}", "compute", rank, t, d, {"i": i}))
        t += d + rng.uniform(0, 5)
    return out


def test_export_parsed_back_is_ordered_and_grouped_by_rank(tmp_path):
    rng = random.Random(0)
    timelines = [_timeline(r, 20, rng) for r in range(4)]
    merged = list(merge_timelines(timelines))
    path = write_chrome_trace(tmp_path / "t.json", merged, rank_names={0: "stage 0"})
    data = json.loads(path.read_text())
    xs = [e for e in data["traceEvents"] if e["ph"] == "X"]
    assert len(xs) == 80
    assert [e["ts"] for e in xs] == sorted(e["ts"] for e in xs)
    # every event sits in its own rank's process, and each rank's events keep their order
    for r in range(4):
        mine = [e for e in xs if e["pid"] == r]
        assert [e["name"] for e in mine] == [e.name for e in timelines[r]]
    names = {
        e["pid"]: e["args"]["name"] for e in data["traceEvents"] if e["name"] == "process_name"
    }
    assert names == {0: "stage 0", 1: "rank 1", 2: "rank 2", 3: "rank 3"}
    back, back_names = read_chrome_trace(path)
    assert back == merged and back_names == names


def test_merge_trace_files(tmp_path):
    rng = random.Random(1)
    files = [write_chrome_trace(tmp_path / f"r{r}.json", _timeline(r, 10, rng)) for r in range(3)]
    events, names = merge_trace_files(files)
    assert len(events) == 30 and set(names) == {0, 1, 2}
    starts = [e.start_us for e in events]
    assert starts == sorted(starts)


@given(st.lists(st.lists(st.floats(0, 1e6, allow_nan=False), max_size=15), max_size=5))
def test_merge_timelines_property(starts):
    timelines = [[Event("x", "c", r, s, 1.0) for s in sorted(ss)] for r, ss in enumerate(starts)]
    merged = list(merge_timelines(timelines))
    assert [e.start_us for e in merged] == sorted(s for ss in starts for s in ss)
    assert sorted((e.rank, e.start_us) for e in merged) == sorted(
        (r, s) for r, ss in enumerate(starts) for s in ss
    )


def test_unordered_timeline_rejected():
    tl = [Event("a", "c", 0, 5.0, 1.0), Event("b", "c", 0, 1.0, 1.0)]
    with pytest.raises(ValueError, match="input 0 is not ascending at position 1"):
        list(merge_timelines([tl]))


def test_negative_duration_rejected(tmp_path):
    with pytest.raises(ValueError, match="negative duration"):
        Event("a", "c", 0, 0.0, -1.0)
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps([{"name": "a", "ph": "X", "ts": 0, "dur": -3, "pid": 0}]))
    with pytest.raises(TraceFormatError, match=r"bad.json: event 0: .*negative duration"):
        read_chrome_trace(bad)


@pytest.mark.parametrize(
    "content, message",
    [
        ("{not json", "not JSON"),
        ('{"foo": 1}', "expected a list of events"),
        ('[{"name": "a", "ph": "X", "ts": 0, "pid": 0}]', "event 0 lacks dur"),
        ('[{"name": "a", "ph": "X", "ts": "x", "dur": 1, "pid": 0}]', "event 0"),
        ("[3]", "event 0 is not an object"),
    ],
)
def test_malformed_files_name_the_file(tmp_path, content, message):
    p = tmp_path / "in.json"
    p.write_text(content)
    with pytest.raises(TraceFormatError, match=message) as info:
        read_chrome_trace(p)
    assert "in.json" in str(info.value)


def test_summary_counts_overlap_once():
    evs = [
        Event("a", "c", 0, 0.0, 10.0),
        Event("b", "c", 0, 5.0, 10.0, lane=1),  # overlaps a: busy 0..15
        Event("c", "c", 0, 20.0, 5.0),  # idle 15..20
    ]
    (s,) = summarize(evs)
    assert (s.span_us, s.busy_us, s.idle_us) == (25.0, 20.0, 5.0)
    assert s.idle_ratio == pytest.approx(0.2)


def test_chrome_trace_has_complete_events_only():
    data = to_chrome_trace([Event("a", "F", 2, 1.0, 2.0, {"mb": 0})])
    (x,) = [e for e in data["traceEvents"] if e["ph"] == "X"]
    assert x == {
        "name": "a",
        "cat": "F",
        "ph": "X",
        "ts": 1.0,
        "dur": 2.0,
        "pid": 2,
        "tid": 0,
        "args": {"mb": 0},
    }


@pytest.mark.parametrize(("ts", "dur"), [(1e308, 1.0), (0.0, 1e308), (float("nan"), 1.0)])
def test_a_trace_with_timestamps_past_any_real_clock_is_refused_on_load(tmp_path, ts, dur):
    path = tmp_path / "rank0.json"
    event = {"name": "F0", "ph": "X", "pid": 0, "tid": 0, "ts": ts, "dur": dur}
    path.write_text(json.dumps({"traceEvents": [event]}))
    with pytest.raises(ValueError, match="not a finite number|is not finite"):
        read_chrome_trace(path)
