"""Fill the tables of measured figures in README.md and docs/ from benchmarks/results/*.json.

A generated table sits between two markers::

    <!-- table: pp_runtime.speedup -->
    | ... the rendered table ... |
    <!-- /table -->

``NAME`` is declared beside the record of the benchmark whose JSON it renders
(``TABLES`` in ``benchmarks/records/<benchmark>.py``; the few tables no one benchmark owns are
in :mod:`scripts.tables`); this script only discovers them and splices their text into the
marked blocks. ``python scripts/doc_tables.py`` rewrites every marked block from the JSON
(``make docs`` runs it);
``--check`` rewrites nothing and exits 1 naming each block that differs from what its JSON
renders to (the test suite runs the same check), so a figure edited by hand, or a benchmark
rerun without regenerating the docs, fails the build.
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import pkgutil
import re
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

if __package__ in (None, ""):  # run as a script: make `scripts` and `benchmarks` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import benchmarks.records
from benchmarks.records import Renderer
from scripts.tables import presets, summary

ROOT = Path(__file__).resolve().parents[1]
BLOCK = re.compile(r"(<!-- table: (?P<name>[\w.\-]+) -->\n)(?P<body>.*?)(<!-- /table -->)", re.S)


def _modules() -> list[ModuleType]:
    """Every module that declares tables: one per benchmark record, then scripts.tables'."""
    names = sorted(m.name for m in pkgutil.iter_modules(benchmarks.records.__path__))
    records = [importlib.import_module(f"benchmarks.records.{n}") for n in names]
    return [*records, summary, presets]


def renderers() -> dict[str, Renderer]:
    """Every table name -> its renderer; a name declared twice is an error."""
    out: dict[str, Renderer] = {}
    for module in _modules():
        for name, fn in module.TABLES.items():
            if name in out:
                raise ValueError(f"table {name!r} is declared twice (again in {module.__name__})")
            out[name] = fn
    return out


def result_records() -> dict[str, Any]:
    """Every ``benchmarks/results/<stem>.json`` a record claims -> that record's type."""
    out: dict[str, Any] = {}
    for module in _modules():
        for stem, kind in getattr(module, "FILES", {}).items():
            if stem in out:
                raise ValueError(f"results file {stem!r} is claimed twice ({module.__name__})")
            out[stem] = kind
    return out


def documents(root: Path = ROOT) -> list[Path]:
    """The files whose tables are generated: README.md and every page under docs/."""
    return [root / "README.md", *sorted((root / "docs").rglob("*.md"))]


def render_text(text: str, tables: dict[str, Renderer], *, where: str = "") -> str:
    """``text`` with every marked block replaced by its renderer's output."""

    def fill(m: re.Match[str]) -> str:
        name = m.group("name")
        if name not in tables:
            raise ValueError(f"{where}: unknown table {name!r}; known: {sorted(tables)}")
        return f"{m.group(1)}{tables[name]().rstrip()}\n{m.group(4)}"

    return BLOCK.sub(fill, text)


def stale_blocks(text: str, tables: dict[str, Renderer], *, where: str = "") -> list[str]:
    """A unified diff per marked block of ``text`` that differs from its rendering, or why
    the block cannot be rendered (its results file does not load through its record)."""
    out = []
    for m in BLOCK.finditer(text):
        try:
            want = render_text(m.group(0), tables, where=where)
        except (ValueError, FileNotFoundError) as e:  # a results file its record refuses
            out.append(f"{where}: table {m.group('name')!r} cannot be rendered: {e}")
            continue
        if want != m.group(0):
            diff = difflib.unified_diff(
                m.group(0).splitlines(), want.splitlines(), "committed", "from JSON", lineterm=""
            )
            out.append(
                f"{where}: table {m.group('name')!r} differs from its JSON:\n" + "\n".join(diff)
            )
    return out


def used_names(paths: list[Path]) -> set[str]:
    return {m.group("name") for p in paths for m in BLOCK.finditer(p.read_text())}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only report stale tables (exit 1)")
    args = parser.parse_args(argv)
    tables = renderers()
    paths = documents()
    problems: list[str] = []
    for path in paths:
        text = path.read_text()
        rel = str(path.relative_to(ROOT))
        if args.check:
            problems += stale_blocks(text, tables, where=rel)
        else:
            new = render_text(text, tables, where=rel)
            if new != text:
                path.write_text(new)
                print(f"updated {rel}")
    unused = sorted(set(tables) - used_names(paths))
    if unused:
        problems.append(f"renderers no document uses: {unused}")
    for p in problems:
        print(p, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
