"""``benchmarks/zb_paper_table.py``: the Zero Bubble paper's bubble table, ours beside the
published figures (docs/pipeline/schedules.md, and the README's headline)."""

from __future__ import annotations

from dataclasses import dataclass

from benchmarks._common import Record, Result, load_result
from benchmarks.records import Renderer, md_table, times


@dataclass(frozen=True, kw_only=True)
class PaperCell(Record):
    """One schedule on one configuration: our bubble rate beside the paper's."""

    ours: float
    published: float
    diff: float
    ok: bool
    peak_memory_vs_1f1b: float
    seconds: float


@dataclass(frozen=True, kw_only=True)
class PaperRow(Record):
    model: str
    p: int
    m: int
    schedules: dict[str, PaperCell]


@dataclass(frozen=True, kw_only=True)
class ZbPaperTable(Result):
    all_ok: bool
    rows: list[PaperRow]


FILES = {"zb_paper_table": ZbPaperTable}

_COLUMNS = (("1f1b", "1F1B ours / paper"), ("zb-h1", "ZB-H1"), ("zb-h2", "ZB-H2"),
            ("zb-1p", "ZB-1p"), ("zb-2p", "ZB-2p"))  # fmt: skip


def paper_table() -> str:
    """Our bubble rate beside the published one, per configuration of the paper."""
    rows = []
    for r in load_result(ZbPaperTable, "zb_paper_table").rows:
        s = r.schedules
        cells: list[object] = [r.model, r.p, r.m]
        cells += [f"{s[n].ours:.4f} / {s[n].published:.4f}" for n, _ in _COLUMNS]
        cells.append(times(s["zb-2p"].peak_memory_vs_1f1b))
        rows.append(cells)
    headers = ["model", "p", "m", *(h for _, h in _COLUMNS), "ZB-2p memory"]
    return md_table(headers, rows)


TABLES: dict[str, Renderer] = {"pipeline.paper_table": paper_table}
