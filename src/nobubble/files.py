"""Input and output files: read with an error that names the file and the fix
(:func:`read_input_text`), checked before any work starts (:func:`check_output_file`,
:func:`check_output_dir`), written atomically (:func:`atomic_path`: a killed run leaves the
old file or none, never a truncated one), and claimed for the length of a run
(:func:`claim_output`: a second live run given the same path is refused).
"""

from __future__ import annotations

import os
import stat
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

__all__ = [
    "read_input_text",
    "check_output_file",
    "check_output_dir",
    "atomic_path",
    "write_text",
    "check_figure_path",
    "pyplot_for",
    "figure",
    "claim_output",
    "proc_stat",
]

FIGURE_SUFFIXES = (".png", ".svg", ".pdf")  # the formats a plot is written in, by the suffix


def read_input_text(
    path: str | os.PathLike[str], fix: str, error: type[ValueError] = ValueError
) -> str:
    """The text of the input file at ``path``.

    Raises:
        ValueError: (or its subclass ``error``) ``{path}: no such file``, ``not UTF-8 text``
            or ``cannot read it (why)``, then ``; {fix}`` (how to get a file that reads).
    """
    try:
        return Path(path).read_text()
    except FileNotFoundError:
        what = "no such file"
    except UnicodeDecodeError:
        what = "not UTF-8 text"
    except OSError as err:  # a folder, unreadable
        what = f"cannot read it ({err.strerror or err})"
    raise error(f"{path}: {what}; {fix}") from None


def _first_existing(path: Path) -> Path:
    for parent in [path, *path.parents]:
        if parent.exists():
            return parent
    return Path(".")


def _check_location(path: Path, what: str, shown: Path | None = None) -> None:
    """The nearest existing folder at or above ``path`` must be a folder where a file can be
    created: tried for real (a permission check says yes to root even on ``/proc``)."""
    anchor = _first_existing(path)
    path = shown or path
    if not anchor.is_dir():
        raise ValueError(f"{what} {path}: {anchor} is a file, not a folder; choose another path")
    try:
        fd, probe = tempfile.mkstemp(prefix=".nobubble-probe.", dir=anchor)
    except OSError as err:
        raise ValueError(
            f"{what} {path}: cannot create files in {anchor} ({err.strerror}); choose another path"
        ) from None
    os.close(fd)
    os.unlink(probe)


def check_output_file(path: str | os.PathLike[str], what: str = "output") -> Path:
    """``path`` as a Path if a regular file can be written there; else ValueError."""
    p = Path(path)
    if p.exists():
        mode = p.stat().st_mode
        if stat.S_ISDIR(mode):
            raise ValueError(f"{what} {p} is a folder; give a file name")
        if not stat.S_ISREG(mode):
            raise ValueError(f"{what} {p} is not a regular file; give a file name")
    _check_location(p.parent, what, shown=p)
    return p


def check_output_dir(path: str | os.PathLike[str], what: str = "output folder") -> Path:
    """``path`` as a Path if it is (or can be created as) a writable folder; else ValueError."""
    p = Path(path)
    if p.exists() and not p.is_dir():
        raise ValueError(f"{what} {p} is a file; give a folder")
    _check_location(p, what)
    return p


def _fsync_dir(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:  # a platform without directory handles
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


@contextmanager
def atomic_path(path: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a temporary path beside ``path`` (same suffix); on success fsync it, rename it
    to ``path`` and fsync the folder, on error remove it. Creates the parent folders. A
    reader sees the old file or the whole new one, even after a crash. The temporary is
    named ``.NAME.PID-RANDOM.tmpSUFFIX``: a writer killed mid-way (SIGKILL runs no cleanup)
    leaves one, which the next write to ``path`` removes once its pid is gone."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    _sweep_dead_temporaries(target)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.{os.getpid()}-",
                               suffix=f".tmp{target.suffix}", dir=target.parent)  # fmt: skip
    os.close(fd)
    try:
        yield Path(tmp)
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, target)
        _fsync_dir(target.parent)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _sweep_dead_temporaries(target: Path) -> None:
    """Remove the temporaries of ``target`` whose writer is no longer running."""
    head, tail = f".{target.name}.", f".tmp{target.suffix}"
    for entry in target.parent.iterdir():
        name = entry.name
        if not (name.startswith(head) and name.endswith(tail)):
            continue
        pid = name[len(head) :].split("-", 1)[0]
        try:
            written = entry.stat().st_mtime
        except FileNotFoundError:  # its writer renamed or removed it meanwhile
            continue
        if pid.isdigit() and not _pid_alive(int(pid), written):
            entry.unlink(missing_ok=True)


def write_text(path: str | os.PathLike[str], text: str) -> Path:
    """Write ``text`` to ``path`` atomically; returns the path."""
    with atomic_path(path) as tmp:
        tmp.write_text(text)
    return Path(path)


def check_figure_path(path: str | os.PathLike[str]) -> Path:
    """``path`` as a Path if its suffix is a format a figure is written in (ValueError
    naming the formats otherwise)."""
    path = Path(path)
    if path.suffix.lower() not in FIGURE_SUFFIXES:
        raise ValueError(
            f"{path}: a figure is written as {', '.join(FIGURE_SUFFIXES)}; give one of them"
        )
    return path


def pyplot_for(path: str | os.PathLike[str]) -> tuple[Any, Path]:
    """``(matplotlib.pyplot on the Agg backend, path)``, after :func:`check_figure_path`."""
    path = check_figure_path(path)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt, path


@contextmanager
def figure(
    path: str | os.PathLike[str],
    *args: Any,
    dpi: int = 110,
    rect: tuple[float, float, float, float] = (0, 0, 1, 1),
    bbox_inches: str | None = None,
    **kwargs: Any,
) -> Iterator[tuple[Any, Any]]:
    """``plt.subplots(*args, **kwargs)`` on the Agg backend (:func:`pyplot_for`); yields
    ``(fig, axes)``, then lays the figure out within ``rect`` and saves it atomically to
    ``path`` (PNG, SVG or PDF by the suffix); the figure is closed either way."""
    plt, path = pyplot_for(path)
    fig, axes = plt.subplots(*args, **kwargs)
    try:
        yield fig, axes
        fig.tight_layout(rect=rect)
        with atomic_path(path) as tmp:
            fig.savefig(tmp, format=path.suffix.lstrip("."), dpi=dpi, bbox_inches=bbox_inches)
    finally:
        plt.close(fig)


def proc_stat(pid: int | None) -> list[str] | None:
    """The fields of ``/proc/<pid>/stat`` after the command name (state, ppid, ...; the
    start time is ``[19]``); None when the process is gone or there is no ``/proc``."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def _pid_alive(pid: int, claimed_at: float) -> bool:
    """Whether ``pid`` is a live process (not a zombie) that could have written a claim at
    ``claimed_at``: a process started after that (the pid reused) is not the claimant."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: alive
        pass
    fields = proc_stat(pid)
    if fields is None or len(fields) < 20:  # no /proc: trust kill
        return True
    try:
        boot = next(
            float(line.split()[1])
            for line in Path("/proc/stat").read_text().splitlines()
            if line.startswith("btime ")
        )
    except (OSError, IndexError, StopIteration, ValueError):  # no /proc: trust kill
        return True
    if fields[0] in ("Z", "X"):
        return False
    started = boot + int(fields[19]) / os.sysconf("SC_CLK_TCK")
    return started <= claimed_at + 2.0  # btime has whole seconds


def _claimant(lock: Path) -> tuple[int | None, float] | None:
    """The pid in a claim file (None if not written yet, or not a pid) and when it was
    written; None if there is no claim file."""
    try:
        text, mtime = lock.read_text(), lock.stat().st_mtime
    except FileNotFoundError:
        return None
    text = text.strip()
    return (int(text) if text.isdigit() else None), mtime


@contextmanager
def claim_output(path: str | os.PathLike[str], wait_s: float = 2.0) -> Iterator[Path]:
    """Hold ``<parent>/.<name>.lock`` (this process's pid, created exclusively) while the
    block runs, so that two runs cannot write one output at once; yields ``path``.

    A claim held by a live process is refused with ValueError naming the path and the pid,
    before any work; a claim whose process is dead (or whose pid was reused since) is taken
    over; a claim file still empty after ``wait_s`` (its writer died between creating and
    writing it) too. The claim is removed on exit, also on an exception, if it is still
    ours. Creates the parent folders, and removes those it created that are still empty on
    exit (a run refused inside the claim leaves nothing behind)."""
    target = Path(path)
    full = Path(os.path.abspath(target))  # ./x and x are one output
    lock = full.parent / f".{full.name}.lock"
    created = [d for d in [lock.parent, *lock.parent.parents] if not d.exists()]
    lock.parent.mkdir(parents=True, exist_ok=True)
    me, deadline = os.getpid(), time.monotonic() + wait_s
    while True:
        try:
            fd = os.open(lock, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            found = _claimant(lock)
            if found is None:  # released meanwhile
                continue
            pid, mtime = found
            if pid is None and time.monotonic() < deadline:  # being written
                time.sleep(0.02)
                continue
            if pid is not None and _pid_alive(pid, mtime):
                raise ValueError(
                    f"{path} is being written by another live run (pid {pid}); "
                    "pass another path (or wait for it)"
                ) from None
            _remove_stale(lock, pid)
            continue
        try:
            os.write(fd, f"{me}\n".encode())
        finally:
            os.close(fd)
        break
    try:
        yield target
    finally:
        found = _claimant(lock)
        if found is not None and found[0] == me:
            lock.unlink(missing_ok=True)
        for folder in created:  # the deepest first
            try:
                folder.rmdir()
            except OSError:  # not empty (the output is in it), or another run's now
                break


def _remove_stale(lock: Path, pid: int | None) -> None:
    """Remove a stale claim by renaming it aside first, so that a fresh claim another run
    made in the meantime is not lost: such a one is put back."""
    aside = lock.with_name(f"{lock.name}.{os.getpid()}.stale")
    try:
        os.rename(lock, aside)
    except FileNotFoundError:  # another run removed it first
        return
    found = _claimant(aside)
    if found is not None and found[0] != pid:  # not the one we judged: put it back
        try:
            os.link(aside, lock)
        except FileExistsError:
            pass
    aside.unlink(missing_ok=True)
