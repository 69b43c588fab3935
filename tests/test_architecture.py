"""The layout's rules, checked on the source: sizes, where printing lives, start-up, cycles.

The layer contract itself (cli > bench > pipeline | moe | rl > trace | distributed >
algorithms) is import-linter's, in ``make lint``; this file checks what it cannot.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import nobubble

PACKAGE = Path(nobubble.__file__).parent
HEAVY = ("torch", "ray", "ortools", "matplotlib", "numpy")
MAX_MODULE_LINES, MAX_FUNCTION_LINES, MAX_MODULES_PER_FOLDER = 500, 80, 15
# The one library module that draws with rich: the table printer and progress bar shared by the
# command line and the scripts in benchmarks/ (which import no nobubble.cli)
RICH_OUTPUT = PACKAGE / "bench" / "output.py"


def _modules() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def _library_modules() -> list[Path]:
    """Every module outside the command line (``nobubble.cli``)."""
    return [p for p in _modules() if "cli" not in p.relative_to(PACKAGE).parts[:1]]


def test_modules_functions_and_folders_stay_small() -> None:
    too_big = []
    for path in _modules():
        text = path.read_text()
        if text.count("\n") > MAX_MODULE_LINES:
            too_big.append(f"{path}: {text.count(chr(10))} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    too_big.append(f"{path}:{node.lineno} {node.name}() is {length} lines")
    for folder in {p.parent for p in _modules()}:
        count = len([p for p in folder.glob("*.py") if p.name != "__init__.py"])
        if count > MAX_MODULES_PER_FOLDER:
            too_big.append(f"{folder}: {count} modules")
    assert not too_big, "\n".join(too_big)


def test_no_library_module_parses_arguments_or_prints() -> None:
    offenders = []
    for path in _library_modules():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import | ast.ImportFrom):
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
                names.append(getattr(node, "module", None) or "")
                for name in names:
                    top = name.split(".")[0]
                    if top == "argparse" or (top == "rich" and path != RICH_OUTPUT):
                        offenders.append(f"{path}:{node.lineno} imports {name}")
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id == "print"
            ):
                offenders.append(f"{path}:{node.lineno} calls print()")
    assert not offenders, "\n".join(offenders)


def test_benchmarks_import_no_cli_and_edit_no_sys_path() -> None:
    """``benchmarks/`` is a package run as ``python -m benchmarks.NAME``: its scripts import
    each other as ``benchmarks.NAME``, never ``nobubble.cli``, and never touch ``sys.path``."""
    scripts = sorted((Path(__file__).resolve().parents[1] / "benchmarks").glob("*.py"))
    assert len(scripts) > 20, scripts
    offenders = []
    for path in scripts:
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            names += [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            offenders += [f"{path}:{node.lineno} imports {n}" for n in names
                          if n == "nobubble.cli" or n.startswith("nobubble.cli.")]  # fmt: skip
            if (isinstance(node, ast.Attribute) and node.attr == "path"
                    and isinstance(node.value, ast.Name) and node.value.id == "sys"):  # fmt: skip
                offenders.append(f"{path}:{node.lineno} uses sys.path")
    assert not offenders, "\n".join(offenders)


_PROBE = """
import sys
from nobubble.cli import main
try:
    main({argv!r})
except SystemExit:
    pass
print("loaded:" + ",".join(sorted({{m.split(".")[0] for m in sys.modules}} & {heavy!r})))
"""


@pytest.mark.parametrize(
    "argv",
    [
        ["--help"],
        ["pp", "--help"],
        ["pp", "run", "--help"],
        ["ep", "--help"],
        ["rl", "--help"],
        ["trace", "--help"],
        ["demo", "--help"],
    ],  # fmt: skip
)
def test_help_imports_no_heavy_package(argv: list[str]) -> None:
    code = _PROBE.format(argv=argv, heavy=set(HEAVY))
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    loaded = out.stdout.strip().splitlines()[-1]
    assert loaded == "loaded:", f"nobubble {' '.join(argv)} imported {loaded}"


def test_python_dash_m_nobubble_cli_help() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "nobubble.cli", "--help"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert "usage: nobubble" in out.stdout


def test_no_import_cycles_between_modules() -> None:
    import grimp  # import-linter's own dependency (the [test] extra)

    graph = grimp.build_graph("nobubble", exclude_type_checking_imports=True)
    # Tarjan's strongly connected components over the module graph, iteratively
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    cycles: list[list[str]] = []
    counter = 0
    for root in sorted(graph.modules):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.find_modules_directly_imported_by(root))))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append(
                        (child, iter(sorted(graph.find_modules_directly_imported_by(child))))
                    )
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    cycles.append(sorted(component))
    assert not cycles, f"import cycles: {cycles}"
