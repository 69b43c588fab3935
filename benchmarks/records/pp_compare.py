"""``benchmarks/pp_compare.py``: every schedule at P=8, M=24 on the paper's 1.5B and 6.2B
costs (docs/pipeline/schedules.md)."""

from __future__ import annotations

from dataclasses import dataclass

from benchmarks._common import Record, Result, load_result
from benchmarks.records import Renderer, md_table, pct, times


@dataclass(frozen=True, kw_only=True)
class Costs(Record):
    t_f: float
    t_b: float
    t_w: float
    t_comm: float


@dataclass(frozen=True, kw_only=True)
class CompareRow(Record):
    """One schedule; ``None`` figures where torch's order is invalid or a size is refused
    (``note`` says which)."""

    schedule: str
    source: str
    kind: str
    bubble_rate: float | None
    makespan: float | None
    peak_memory_vs_1f1b: float | None
    throughput_vs_1f1b: float | None
    throughput_vs_1f1b_flush: float | None
    note: str


@dataclass(frozen=True, kw_only=True)
class ModelCompare(Record):
    costs: Costs
    rows: list[CompareRow]


@dataclass(frozen=True, kw_only=True)
class PpCompare(Result):
    p: int
    m: int
    num_chunks: int
    torch: str | None  # torch's version, None where it is not installed
    models: dict[str, ModelCompare]


FILES = {"pp_compare": PpCompare}


def _bold(text: str, on: bool) -> str:
    return f"**{text}**" if on else text


def compare_p8_m24() -> str:
    """Every schedule on the paper's 1.5B and 6.2B costs; the best bubble and throughput of
    each model in bold."""
    data = load_result(PpCompare, "pp_compare")
    models = list(data.models)
    per_model = {m: {r.schedule: r for r in data.models[m].rows} for m in models}
    best = {}
    for m in models:
        valid = [r for r in per_model[m].values() if r.bubble_rate is not None]
        speeds = [r.throughput_vs_1f1b for r in valid if r.throughput_vs_1f1b is not None]
        best[m] = (min(r.bubble_rate for r in valid if r.bubble_rate is not None),
                   max(speeds) if speeds else None)  # fmt: skip
    rows = []
    for row in data.models[models[0]].rows:
        name = row.schedule
        label = f"{name} (v={data.num_chunks})" if name == "interleaved-1f1b" else name
        cells: list[object] = []
        starred = False
        for m in models:
            r = per_model[m][name]
            if r.bubble_rate is None:  # torch's invalid order, or a size it refuses
                cells += ["invalid order" if "invalid" in r.note else "not built", "", ""]
                continue
            assert r.peak_memory_vs_1f1b is not None and r.throughput_vs_1f1b is not None
            top_bubble = r.bubble_rate == best[m][0]
            top_speed = r.throughput_vs_1f1b == best[m][1]
            starred |= top_bubble or top_speed
            cells += [
                _bold(pct(r.bubble_rate, 2), top_bubble),
                times(r.peak_memory_vs_1f1b),
                _bold(times(r.throughput_vs_1f1b, 3), top_speed),
            ]
        if all(per_model[m][name].bubble_rate is None for m in models):
            cells = [cells[0]] + [""] * (len(cells) - 1)  # say it once
        rows.append([_bold(label, starred), row.source, *cells])
    headers = ["schedule", "from"]
    for m in models:
        headers += [f"{m} bubble", f"{m} peak mem", f"{m} throughput"]
    return md_table(headers, rows, align="ll" + "r" * (len(headers) - 2))


TABLES: dict[str, Renderer] = {"pipeline.compare_p8_m24": compare_p8_m24}
