"""Renderers of the measured-figure tables in README.md and docs/, one module per part.

Each module defines ``TABLES: dict[str, Callable[[], str]]``: a table name (the one written in
the ``<!-- table: NAME -->`` marker) to a function that reads ``benchmarks/results/*.json``
(through :func:`load`) and returns the table as Markdown (through :func:`md_table`).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"

Renderer = Callable[[], str]


def load(name: str) -> Any:
    """The JSON a benchmark wrote, ``benchmarks/results/NAME``."""
    path = RESULTS / name
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing: run the benchmark that writes it")
    return json.loads(path.read_text())


def md_table(headers: Sequence[str], rows: Sequence[Sequence[object]], align: str = "") -> str:
    """A Markdown table; ``align`` is one letter per column (``l``/``r``/``c``), default
    left for the first column and right for the rest."""
    align = align or "l" + "r" * (len(headers) - 1)
    if len(align) != len(headers):
        raise ValueError(f"align={align!r} needs one letter per column ({len(headers)})")
    rule = {"l": "---", "r": "---:", "c": ":---:"}
    lines = [
        "| " + " | ".join(headers) + " |",
        "|" + "|".join(rule[a] for a in align) + "|",
    ]
    for row in rows:
        if len(row) != len(headers):
            raise ValueError(f"row {row!r} has {len(row)} cells for {len(headers)} columns")
        lines.append("| " + " | ".join(str(c) for c in row) + " |")
    return "\n".join(lines)


def f(value: float, digits: int = 1) -> str:
    """A fixed-point number with ``digits`` decimals."""
    return f"{value:.{digits}f}"


def pct(value: float, digits: int = 1) -> str:
    """A fraction as a percentage."""
    return f"{100 * value:.{digits}f}%"


def times(value: float, digits: int = 2) -> str:
    """A ratio as ``1.23x``."""
    return f"{value:.{digits}f}x"
