"""``benchmarks/pp_v_memory.py``: the V schedules of controllable memory beside ZB-V, ZB-1p and
1F1B, and the bubble-memory frontier at P=8, M=24 (docs/pipeline/schedules.md)."""

from __future__ import annotations

from dataclasses import dataclass

from benchmarks._common import Record, Result, load_result
from benchmarks.records import Renderer, md_table, pct


@dataclass(frozen=True, kw_only=True)
class VCell(Record):
    """One schedule on one configuration; memory in rank units."""

    bubble_rate: float
    peak_memory: float
    memory_bound: float | None
    within_bound: bool
    seconds: float


@dataclass(frozen=True, kw_only=True)
class VRow(Record):
    model: str
    p: int
    m: int
    schedules: dict[str, VCell]


@dataclass(frozen=True, kw_only=True)
class FrontierPoint(Record):
    schedule: str
    source: str
    peak_memory: float | None
    bubble_rate: float | None
    mem_limit: float | None
    note: str
    pareto: bool


@dataclass(frozen=True, kw_only=True)
class Frontier(Record):
    model: str
    seconds: float
    points: list[FrontierPoint]
    pareto: list[str]


@dataclass(frozen=True, kw_only=True)
class PpVMemory(Result):
    all_within_bound: bool
    rows: list[VRow]
    frontiers: list[Frontier]


FILES = {"pp_v_memory": PpVMemory}

_V_NAMES = ("v-min", "v-half", "v-zb", "zb-v", "zb-1p", "1f1b")


def v_memory_table() -> str:
    """Bubble rate and peak activation memory (rank units) of the V schedules beside ZB-V,
    ZB-1p and 1F1B, per configuration of the paper."""
    rows = []
    for r in load_result(PpVMemory, "pp_v_memory").rows:
        s = r.schedules
        cells: list[object] = [r.model, r.p, r.m]
        cells += [f"{pct(s[n].bubble_rate)} ({s[n].peak_memory:.2f})" for n in _V_NAMES]
        rows.append(cells)
    headers = ["model", "p", "m", "V-Min", "V-Half", "V-ZB", "ZB-V", "ZB-1p", "1F1B"]
    return md_table(headers, rows)


def _point(q: FrontierPoint) -> str:
    assert q.peak_memory is not None and q.bubble_rate is not None  # a Pareto point was built
    return f"{q.schedule} {q.peak_memory:.2f} / {pct(q.bubble_rate)}"


def frontier_p8_m24() -> str:
    """The Pareto-optimal points of the frontier at P=8, M=24, per model."""
    rows = []
    for fr in load_result(PpVMemory, "pp_v_memory").frontiers:
        points = {q.schedule: q for q in fr.points}
        best = sorted((points[n] for n in fr.pareto), key=lambda q: q.peak_memory or 0.0)
        rows.append([fr.model, f"{fr.seconds:.1f} s", "; ".join(_point(q) for q in best)])
    return md_table(["model", "time", "Pareto set: schedule memory / bubble"], rows)


TABLES: dict[str, Renderer] = {
    "pipeline.v_memory": v_memory_table,
    "pipeline.frontier_p8_m24": frontier_p8_m24,
}
