"""The record each benchmark writes and the docs tables it feeds, one module per benchmark.

``benchmarks/records/NAME.py`` belongs to ``benchmarks/NAME.py`` and defines:

- the benchmark's JSON schema as frozen dataclasses (:class:`benchmarks._common.Result` and
  its rows); the benchmark writes through it, the docs read through it;
- ``FILES: dict[str, type]``: each ``benchmarks/results/<stem>.json`` it writes -> its record;
- ``TABLES: dict[str, Callable[[], str]]``: each table name (the ``NAME`` of a
  ``<!-- table: NAME -->`` marker in README.md or docs/) -> the function rendering it as
  Markdown from the record.

These modules import nothing heavy at module level (no torch, no nobubble), so
``scripts/doc_tables.py`` imports them all cheaply. This ``__init__`` holds the Markdown
formatting they share.
"""

from __future__ import annotations

import re
import textwrap
from collections.abc import Callable, Sequence

Renderer = Callable[[], str]


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


def count(value: float) -> str:
    """A count or rate rounded to an integer, with thousands separators: ``15,942``."""
    return f"{round(value):,}"


def prose(*sentences: str) -> str:
    """Sentences as one paragraph wrapped like the hand-written text around it (never
    between a number and its unit)."""
    text = re.sub(r"(\d) (s|µs)\b", "\\1\0\\2", " ".join(sentences))
    return textwrap.fill(text, width=96, break_on_hyphens=False).replace("\0", " ")
