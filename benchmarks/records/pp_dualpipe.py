"""``benchmarks/pp_dualpipe.py``: DualPipe and DualPipeV beside ZB-V and 1F1B on the paper's
configurations (docs/pipeline/schedules.md)."""

from __future__ import annotations

from dataclasses import dataclass

from benchmarks._common import Record, Result, load_result
from benchmarks.records import Renderer, md_table, pct


@dataclass(frozen=True, kw_only=True)
class DualPipeCell(Record):
    """One schedule on one configuration; memory and parameters in rank units."""

    bubble_rate: float
    peak_memory: float
    params_per_rank: float
    overlapped_cells_per_rank: int
    seconds: float


@dataclass(frozen=True, kw_only=True)
class DualPipeRow(Record):
    model: str
    p: int
    m: int
    schedules: dict[str, DualPipeCell]


@dataclass(frozen=True, kw_only=True)
class PpDualpipe(Result):
    note: str
    rows: list[DualPipeRow]


FILES = {"pp_dualpipe": PpDualpipe}

_NAMES = ("dualpipe", "dualpipev", "zb-v", "1f1b")


def dualpipe_table() -> str:
    """DualPipe, DualPipeV, ZB-V and 1F1B on the paper's 12 configurations: bubble rate (peak
    activation memory in rank units)."""
    rows = []
    for r in load_result(PpDualpipe, "pp_dualpipe").rows:
        s = r.schedules
        cells: list[object] = [r.model, r.p, r.m]
        cells += [f"{pct(s[n].bubble_rate)} ({s[n].peak_memory:.2f})" for n in _NAMES]
        cells.append(s["dualpipev"].overlapped_cells_per_rank)
        rows.append(cells)
    headers = ["model", "p", "m", "DualPipe (fold)", "DualPipeV", "ZB-V", "1F1B", "F&B cells"]
    return md_table(headers, rows)


TABLES: dict[str, Renderer] = {"pipeline.dualpipe": dualpipe_table}
