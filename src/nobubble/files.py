"""Output files: checked before any work starts, written atomically.

- :func:`check_output_file` / :func:`check_output_dir`: refuse a path that cannot be written
  (a folder where a file is wanted, a file where a folder is needed, a special file such as
  ``/dev/null``, a read-only or missing location) with a message naming it, so a command
  fails before it computes anything.
- :func:`atomic_path`: write to a temporary file beside the target and rename it over the
  target only once the write finished, so a run killed mid-write leaves the old file (or
  none), never a truncated one. :func:`write_text` and :func:`save_figure` use it.
"""

from __future__ import annotations

import os
import stat
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

__all__ = ["check_output_file", "check_output_dir", "atomic_path", "write_text", "save_figure"]


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
    reader sees the old file or the whole new one, even after a crash."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=target.suffix, dir=target.parent)
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


def write_text(path: str | os.PathLike[str], text: str) -> Path:
    """Write ``text`` to ``path`` atomically; returns the path."""
    with atomic_path(path) as tmp:
        tmp.write_text(text)
    return Path(path)


def save_figure(fig: Any, path: str | os.PathLike[str], **kwargs: Any) -> Path:
    """``fig.savefig`` to ``path`` atomically (the format from the suffix); returns the path."""
    target = Path(path)
    with atomic_path(target) as tmp:
        fig.savefig(tmp, format=target.suffix.lstrip(".") or None, **kwargs)
    return target
