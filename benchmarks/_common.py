"""Helpers shared by the benchmark scripts: repeated timing, medians, JSON output."""

from __future__ import annotations

import json
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"


def time_median(
    fn: Callable[[], Any], repeats: int, setup: Callable[[], Any] | None = None
) -> float:
    """Median wall time of ``fn(setup())`` (or ``fn()``) over ``repeats`` runs, seconds."""
    times = []
    for _ in range(repeats):
        arg = setup() if setup is not None else None
        t0 = time.perf_counter()
        fn(arg) if setup is not None else fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def time_interleaved(
    fns: dict[str, Callable[[], Any]],
    repeats: int,
    setups: dict[str, Callable[[], Any]] | None = None,
) -> dict[str, float]:
    """Median seconds of each function, timed round-robin (A B C, B C A, ...) so that a burst
    of load on a shared machine hits every method alike. ``setups[name]()``, when given,
    builds the argument for ``fns[name]`` outside the timed region."""
    setups = setups or {}
    names = list(fns)
    times: dict[str, list[float]] = {n: [] for n in names}
    for rep in range(repeats):
        for name in names[rep % len(names) :] + names[: rep % len(names)]:
            arg = setups[name]() if name in setups else None
            t0 = time.perf_counter()
            fns[name](arg) if name in setups else fns[name]()
            times[name].append(time.perf_counter() - t0)
    return {n: statistics.median(t) for n, t in times.items()}


def write_json(name: str, data: dict[str, Any]) -> Path:
    """Write ``benchmarks/results/<name>.json`` with machine facts attached."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    data = {
        "machine": {"python": platform.python_version(), "processor": platform.machine()},
        **data,
    }
    path.write_text(json.dumps(data, indent=2))
    return path


# -- the Zero Bubble paper's 12 configurations (tests/pipeline/data) ------------------------

PAPER_TABLE = RESULTS.parents[1] / "tests" / "pipeline" / "data" / "zb_iclr_bubble_table.csv"


def paper_rows(quick: bool = False) -> list[dict[str, str]]:
    """The paper table's rows (``quick``: only the p=8 ones)."""
    import csv

    rows = list(csv.DictReader(PAPER_TABLE.open()))
    return [r for r in rows if r["p"] == "8"] if quick else rows


def paper_costs(row: dict[str, str]) -> Any:
    """One row's per-rank costs and memory model (:meth:`CostModel.paper`)."""
    from nobubble.pipeline import CostModel

    return CostModel.paper(
        int(row["p"]), t_f=float(row["T_F_ms"]), t_b=float(row["T_B_ms"]),
        t_w=float(row["T_W_ms"]), t_comm=float(row["T_comm_ms"]),
        hidden=int(row["hidden"]), heads=int(row["heads"]), seq=int(row["seq"]),
    )  # fmt: skip


def print_bubble_memory(names: tuple[str, ...], results: list[dict[str, Any]]) -> None:
    """Per configuration and schedule: bubble rate (peak activation memory, rank units)."""
    from nobubble.bench.output import print_table

    print_table("bubble rate (peak activation memory, rank units)", ["model", "p", "m", *names],
                [[r["model"], r["p"], r["m"], *(f"{r['schedules'][n]['bubble_rate']:.2%} "
                  f"({r['schedules'][n]['peak_memory']:.2f})" for n in names)]
                 for r in results])  # fmt: skip
