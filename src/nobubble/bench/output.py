"""What the measuring code shows a person: rich tables or JSON on stdout, a progress bar on
stderr (figures: :func:`nobubble.files.figure`); one copy for the command line, ``nobubble
demo`` and ``benchmarks/``.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, TypeVar

from rich.console import Console
from rich.table import Table

__all__ = [
    "console",
    "print_table",
    "print_json",
    "print_result",
    "progress_bar",
    "run_with_progress_bar",
]

T = TypeVar("T")


def console(stderr: bool = False) -> Console:
    """A rich console (no colour codes when not a terminal)."""
    stream = sys.stderr if stderr else sys.stdout
    # Piped output gets a wide page instead of rich's 80 columns, so tables stay readable.
    width = None if stream.isatty() else 160
    return Console(stderr=stderr, highlight=False, soft_wrap=True, width=width)


def print_table(
    title: str | None,
    columns: Sequence[str],
    rows: Sequence[Sequence[Any]],
    *,
    caption: str | None = None,
) -> None:
    """Print a table; floats are shown with 4 significant decimals."""
    table = Table(title=title, caption=caption, show_lines=False)
    for i, c in enumerate(columns):
        table.add_column(str(c), justify="left" if i == 0 else "right")
    for row in rows:
        table.add_row(*[_fmt(v) for v in row])
    console().print(table)


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        if v != 0 and (abs(v) >= 1e5 or abs(v) < 1e-3):
            return f"{v:.4g}"
        return f"{v:.4f}"
    return str(v)


def print_json(data: Any) -> None:
    """Print ``data`` as JSON on stdout (one document)."""
    json.dump(data, sys.stdout, indent=2, default=_json_default)
    sys.stdout.write("\n")


def print_result(
    as_json: bool,
    data: Any,
    title: str | None,
    columns: Sequence[str],
    rows: Sequence[Sequence[Any]],
    *,
    caption: str | None = None,
    files: Sequence[str] = (),
) -> None:
    """The one renderer of a command's result: ``data`` as JSON (``--json``), else the table
    of ``columns`` and ``rows`` under ``title``, its ``caption`` naming each file written."""
    if as_json:
        print_json(data)
        return
    caption = "; ".join([*([caption] if caption else []), *(f"wrote {f}" for f in files)])
    print_table(title, columns, rows, caption=caption or None)


def _json_default(o: Any) -> Any:
    if hasattr(o, "tolist"):
        return o.tolist()
    if hasattr(o, "__fspath__"):
        return str(o)
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")


@contextmanager
def progress_bar(
    label: str,
    *,
    total: int | None,
    counter: str | None = "{task.completed}/{task.total}",
    info: bool = False,
    quiet: bool = False,
) -> Iterator[tuple[Any, Any]]:
    """The one progress bar: transient, on stderr, after ``label`` the ``counter`` column and
    (``info``) a free ``info`` field; none when ``quiet`` or off a terminal (there a bar
    draws only a blank line, before an error's one line too). Yields ``(progress, task)``
    for ``progress.update(task, completed=..., info=...)``."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    columns = [TextColumn("{task.description}"), BarColumn()]
    columns += [TextColumn(counter)] if counter is not None else []
    columns += [TextColumn("{task.fields[info]}")] if info else []
    err = console(stderr=True)
    with Progress(*columns, TimeElapsedColumn(), console=err, transient=True,
                  disable=quiet or not err.is_terminal) as bar:  # fmt: skip
        yield bar, bar.add_task(label, total=total, info="")


def run_with_progress_bar(
    work: Callable[[Any], T],
    *,
    label: str,
    total: int | None = None,
    counter: str | None = "{task.completed}/{task.total}",
    info: Callable[[tuple[Any, ...]], str] | None = None,
    quiet: bool = False,
) -> T:
    """Run ``work(updates)`` in a worker thread while a transient progress bar on stderr
    (starting at ``label`` and ``total``; none when ``quiet``) follows the messages
    ``(description, done, total, *extra)`` that ranks put on ``updates`` (a queue of
    :func:`nobubble.distributed.worker_context`); ``info(extra)`` is shown after the
    ``counter``. Whatever ``work`` raises is raised again in the caller's thread."""
    import queue
    import threading

    from nobubble.distributed import worker_context

    updates = worker_context().Queue()
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["result"] = work(updates)
        except BaseException as err:  # noqa: BLE001 - re-raised in the caller's thread
            box["error"] = err

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    with progress_bar(label, total=total, counter=counter, info=info is not None,
                      quiet=quiet) as (bar, task):  # fmt: skip
        while thread.is_alive():
            try:
                description, done, steps, *extra = updates.get(timeout=0.5)
            except queue.Empty:
                continue
            shown = info(tuple(extra)) if info is not None else ""
            bar.update(task, description=description, completed=done, total=steps, info=shown)
    thread.join()
    if "error" in box:
        raise box["error"]
    return box["result"]
