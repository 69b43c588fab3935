"""Processes that die with their launcher.

A rank or worker calls :func:`die_with_parent` first thing, so a killed ``nobubble`` command
(SIGKILL included, where no ``finally`` runs) leaves no process behind it training at full
CPU; a long-lived worker polls :func:`launcher_alive` between jobs. Linux only (the
parent-death signal); elsewhere :func:`die_with_parent` does nothing.
"""

from __future__ import annotations

import ctypes
import multiprocessing as mp
import os
import signal
import sys
from pathlib import Path

__all__ = ["die_with_parent", "launcher_alive"]


def die_with_parent(parent_pid: int) -> None:
    """Make this process die when ``parent_pid`` (its launcher) does (Linux: the
    parent-death signal), so a killed ``nobubble`` command leaves no worker behind it.

    A process started by ``multiprocessing``'s forkserver has the forkserver as its parent;
    the forkserver exits when the launcher does, and the signal follows from it."""
    if sys.platform != "linux":
        return
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    if not launcher_alive(parent_pid):  # the launcher died before the signal was armed
        os._exit(1)
    _release_forkserver()


def launcher_alive(parent_pid: int) -> bool:
    """Whether this process's launcher ``parent_pid`` is still its parent, directly or
    through the forkserver that forked it."""
    parent = os.getppid()
    return parent_pid in (parent, _parent_of(parent))


def _release_forkserver() -> None:
    """Close this process's copy of the forkserver's keep-alive pipe: the server lives while
    any holder does, so a rank holding it would keep the server, and through the server's
    death signal itself, alive after its launcher was killed."""
    from multiprocessing import forkserver

    server = getattr(forkserver, "_forkserver", None)
    fd = getattr(server, "_forkserver_alive_fd", None)
    if fd is not None and mp.parent_process() is not None:
        os.close(fd)
        server._forkserver_alive_fd = None  # type: ignore[union-attr]


def _parent_of(pid: int) -> int | None:
    """The parent of ``pid`` from ``/proc`` (None when it is gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[1])  # the fields after "(comm)": state, ppid
