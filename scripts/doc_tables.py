"""Fill the tables of measured figures in README.md and docs/ from benchmarks/results/*.json.

A generated table sits between two markers::

    <!-- table: pp_runtime.speedup -->
    | ... the rendered table ... |
    <!-- /table -->

``NAME`` is a renderer in :mod:`scripts.tables` (one module per part). ``python
scripts/doc_tables.py`` rewrites every marked block from the JSON (``make docs`` runs it);
``--check`` rewrites nothing and exits 1 naming each block that differs from what its JSON
renders to (the test suite runs the same check), so a figure edited by hand, or a benchmark
rerun without regenerating the docs, fails the build.
"""

from __future__ import annotations

import argparse
import difflib
import re
import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make `scripts` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from scripts.tables import ROOT, Renderer
from scripts.tables import moe as moe_tables
from scripts.tables import pipeline as pipeline_tables
from scripts.tables import rl as rl_tables
from scripts.tables import rl_partial as rl_partial_tables
from scripts.tables import rl_scaling as rl_scaling_tables
from scripts.tables import summary as summary_tables

BLOCK = re.compile(r"(<!-- table: (?P<name>[\w.\-]+) -->\n)(?P<body>.*?)(<!-- /table -->)", re.S)


def renderers() -> dict[str, Renderer]:
    """Every table name -> its renderer; a name defined twice is an error."""
    out: dict[str, Renderer] = {}
    modules = (pipeline_tables, moe_tables, rl_tables, rl_partial_tables, rl_scaling_tables,
               summary_tables)  # fmt: skip
    for module in modules:
        for name, fn in module.TABLES.items():
            if name in out:
                raise ValueError(f"table {name!r} is defined twice")
            out[name] = fn
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
    """A unified diff per marked block of ``text`` that differs from its rendering."""
    out = []
    for m in BLOCK.finditer(text):
        want = render_text(m.group(0), tables, where=where)
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
