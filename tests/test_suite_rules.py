"""The test suite's own rules, checked on its source: no test module imports another.

A helper that two test modules share lives in a module not named ``test_*`` (beside the
tests, e.g. ``tests/pipeline/paper_table.py``), or, when it is a reference the package's
fast paths are checked against, in the package itself (``nobubble.pipeline.reference``).
Importing a test module from another runs its tests' module-level code twice, ties one file's
collection to another's, and hides the helper where nobody looks for it.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

TESTS = Path(__file__).parent


def _is_test_module(dotted: str) -> bool:
    return dotted.rsplit(".", 1)[-1].startswith("test_")


def imported_test_modules(source: str) -> list[tuple[int, str]]:
    """``(line, module)`` for every import of a ``test_*`` module of this suite in ``source``:
    absolute (``tests.a.test_b``, ``from tests.a import test_b``) or relative (``.test_b``,
    ``from . import test_b``)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names
                      if a.name.startswith("tests.") and any(
                          _is_test_module(part) for part in a.name.split("."))]  # fmt: skip
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level == 0 and module != "tests" and not module.startswith("tests."):
                continue
            base = "." * node.level + module
            if any(_is_test_module(part) for part in module.split(".")):
                found.append((node.lineno, base))
            sep = "" if base.endswith(".") else "."
            found += [(node.lineno, f"{base}{sep}{a.name}") for a in node.names
                      if _is_test_module(a.name)]  # fmt: skip
    return found


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("from tests.pipeline.test_paper_table import ROWS", ["tests.pipeline.test_paper_table"]),
        ("from .test_eplb import problems", [".test_eplb"]),
        ("from . import test_eplb", [".test_eplb"]),
        ("from tests.cli import test_signals", ["tests.cli.test_signals"]),
        ("import tests.cli.test_signals", ["tests.cli.test_signals"]),
        ("from tests.pipeline.paper_table import ROWS", []),
        ("from .eplb_cases import problems", []),
        ("from torch.testing import assert_close", []),
        ("from nobubble.pipeline.reference import reference_step", []),
    ],
)
def test_the_rule_sees_every_form_of_import(source: str, expected: list[str]) -> None:
    assert [module for _, module in imported_test_modules(source)] == expected


def test_no_test_module_imports_another() -> None:
    offenders = [
        f"{path.relative_to(TESTS.parent)}:{line} imports {module}"
        for path in sorted(TESTS.rglob("test_*.py"))
        for line, module in imported_test_modules(path.read_text())
    ]
    hint = "move the shared helper into a module not named test_*:"
    assert not offenders, "\n".join([hint, *offenders])
