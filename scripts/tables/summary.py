"""Tables of the summary docs, rendered from benchmarks/results/*.json."""

from __future__ import annotations

from scripts.tables import Renderer

TABLES: dict[str, Renderer] = {}
