"""Execution traces: per-rank timelines of :class:`Event` s, merged by start time
(:func:`merge_timelines`, a lazy k-way merge) and read and written in the Chrome Trace Event
format (complete ``"X"`` events, one named process per rank) that Perfetto opens. Files of
other tools load too when their events have ``name``, ``ts``, ``dur`` and ``pid``; anything
else raises :class:`TraceFormatError` naming the file and the event's index.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nobubble.algorithms.merge import kmerge
from nobubble.files import read_input_text, write_text
from nobubble.validation import finite

__all__ = [
    "Event",
    "TraceFormatError",
    "RankSummary",
    "merge_timelines",
    "to_chrome_trace",
    "write_chrome_trace",
    "read_chrome_trace",
    "merge_trace_files",
    "summarize",
]


@dataclass(frozen=True, slots=True)
class Event:
    """One span of work on one rank.

    Attributes:
        name: what ran, e.g. ``"F3"`` (forward of microbatch 3) or ``"dispatch"``.
        cat: category used for colouring and filtering, e.g. ``"F"``, ``"comm"``, ``"rollout"``.
        rank: the process (pipeline rank, EP rank, RL stage) the event ran on.
        start_us: start time in microseconds from a common origin.
        dur_us: duration in microseconds, >= 0.
        args: free-form details shown by the viewer (stage, microbatch, bytes, ...).
        lane: a thread id inside the rank (e.g. 0 compute, 1 communication).
    """

    name: str
    cat: str
    rank: int
    start_us: float
    dur_us: float
    args: Mapping[str, Any] = field(default_factory=dict)
    lane: int = 0

    def __post_init__(self) -> None:
        if not (isinstance(self.dur_us, int | float) and finite(self.dur_us)):
            raise ValueError(f"event {self.name!r}: dur_us={self.dur_us!r} is not a finite number")
        if self.dur_us < 0:
            raise ValueError(
                f"event {self.name!r} on rank {self.rank}: negative duration {self.dur_us} us; "
                "record end >= start"
            )
        if not (isinstance(self.start_us, int | float) and finite(self.start_us)):
            raise ValueError(f"event {self.name!r}: start_us={self.start_us!r} is not finite")

    @property
    def end_us(self) -> float:
        return self.start_us + self.dur_us


class TraceFormatError(ValueError):
    """A trace file that is not a readable Chrome trace; the message names file and event."""


def merge_timelines(timelines: Iterable[Iterable[Event]]) -> Iterator[Event]:
    """Merge per-rank timelines, each ordered by start time, into one time-ordered stream.

    Equal start times keep the order of the input timelines (stable). An input that is not
    ordered by ``start_us`` raises ValueError naming its index and position.
    """
    return kmerge(*timelines, key=_start, check_sorted=True)


def _start(e: Event) -> float:
    return e.start_us


def to_chrome_trace(
    events: Iterable[Event], *, rank_names: Mapping[int, str] | None = None
) -> dict[str, Any]:
    """The Chrome Trace Event JSON object for ``events``.

    One process per rank (``pid`` = rank, named ``rank_names[rank]`` or ``"rank R"`` and sorted
    by rank), one complete event per :class:`Event`.
    """
    events = list(events)
    names = rank_names or {}
    meta = [
        item
        for r in sorted({e.rank for e in events})
        for item in (
            {
                "name": "process_name",
                "ph": "M",
                "pid": r,
                "args": {"name": names.get(r, f"rank {r}")},
            },
            {"name": "process_sort_index", "ph": "M", "pid": r, "args": {"sort_index": r}},
        )
    ]
    trace_events = [
        {
            "name": e.name,
            "cat": e.cat,
            "ph": "X",
            "ts": e.start_us,
            "dur": e.dur_us,
            "pid": e.rank,
            "tid": e.lane,
            "args": dict(e.args),
        }
        for e in events
    ]
    return {"traceEvents": meta + trace_events, "displayTimeUnit": "ms"}


def write_chrome_trace(
    path: str | Path, events: Iterable[Event], *, rank_names: Mapping[int, str] | None = None
) -> Path:
    """Write ``events`` as a Chrome trace JSON file; returns the path."""
    path = Path(path)
    write_text(path, json.dumps(to_chrome_trace(events, rank_names=rank_names)))
    return path


def read_chrome_trace(path: str | Path) -> tuple[list[Event], dict[int, str]]:
    """Read the complete events of a Chrome trace file, sorted by start time.

    Returns the events and the process names found in its metadata. Accepts both the object
    form (``{"traceEvents": [...]}``) and the bare array form. Raises
    :class:`TraceFormatError` naming the file (and the event index) when the file is not JSON,
    an event lacks a field, or a duration is negative.
    """
    path = Path(path)
    text = read_input_text(path, "give a JSON trace file", TraceFormatError)
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise TraceFormatError(f"{path}: not JSON ({err})") from None
    except RecursionError:  # [[[[...]]]]: Python's parser gives up, as any reader would
        raise TraceFormatError(f"{path}: JSON nested too deeply to be a trace") from None
    raw = data.get("traceEvents") if isinstance(data, dict) else data
    if not isinstance(raw, list):
        raise TraceFormatError(f"{path}: expected a list of events or an object with 'traceEvents'")
    events: list[Event] = []
    names: dict[int, str] = {}
    for i, ev in enumerate(raw):
        if not isinstance(ev, dict):
            raise TraceFormatError(f"{path}: event {i} is not an object")
        ph = ev.get("ph", "X")
        if ph == "M":
            if ev.get("name") == "process_name" and isinstance(ev.get("pid"), int):
                names[ev["pid"]] = str(ev.get("args", {}).get("name", ev["pid"]))
            continue
        if ph != "X":
            continue  # instant/counter/flow events carry no span; they are not merged
        missing = [k for k in ("name", "ts", "dur", "pid") if k not in ev]
        if missing:
            raise TraceFormatError(f"{path}: event {i} lacks {', '.join(missing)}")
        try:
            events.append(
                Event(
                    name=str(ev["name"]),
                    cat=str(ev.get("cat", "")),
                    rank=int(ev["pid"]),
                    start_us=float(ev["ts"]),
                    dur_us=float(ev["dur"]),
                    args=dict(ev.get("args") or {}),
                    lane=int(ev.get("tid", 0)),
                )
            )
        except (TypeError, ValueError) as err:
            raise TraceFormatError(f"{path}: event {i}: {err}") from None
    events.sort(key=_start)
    return events, names


def merge_trace_files(paths: Sequence[str | Path]) -> tuple[list[Event], dict[int, str]]:
    """Read several trace files (typically one per rank) and merge them by start time."""
    if not paths:
        raise ValueError("merge_trace_files: no input files; pass one trace file per rank")
    read = [read_chrome_trace(p) for p in paths]
    names = {rank: name for _, found in read for rank, name in found.items()}
    return list(merge_timelines(events for events, _ in read)), names


@dataclass(frozen=True)
class RankSummary:
    """Busy and idle time of one rank over its span (first start to last end)."""

    rank: int
    num_events: int
    span_us: float
    busy_us: float

    @property
    def idle_us(self) -> float:
        return self.span_us - self.busy_us

    @property
    def idle_ratio(self) -> float:
        return self.idle_us / self.span_us if self.span_us > 0 else 0.0


def summarize(events: Iterable[Event]) -> list[RankSummary]:
    """Per-rank busy time (union of its events' intervals, lane 0..n together) and span."""
    by_rank: dict[int, list[Event]] = {}
    for e in events:
        by_rank.setdefault(e.rank, []).append(e)
    out = []
    for rank in sorted(by_rank):
        evs = sorted(by_rank[rank], key=_start)
        busy = 0.0
        cur_start, cur_end = evs[0].start_us, evs[0].end_us
        for e in evs[1:]:
            if e.start_us > cur_end:
                busy += cur_end - cur_start
                cur_start, cur_end = e.start_us, e.end_us
            else:
                cur_end = max(cur_end, e.end_us)
        busy += cur_end - cur_start
        span = max(e.end_us for e in evs) - evs[0].start_us
        out.append(RankSummary(rank=rank, num_events=len(evs), span_us=span, busy_us=busy))
    return out
