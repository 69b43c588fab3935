"""The processes of a launcher's session, read from /proc (Linux only).

Shared by ``test_signals`` and ``test_faults``: the launcher starts in a session of its own
(``start_new_session=True``), so its session id is its pid, and whatever is left of the run
is whatever still lives in that session.
"""

from __future__ import annotations

import signal
from pathlib import Path


def default_sigint() -> None:
    """In the child: SIGINT's default action, even under a suite started in the background
    (whose shell ignores SIGINT, which stays ignored across exec)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def session_members(sid: int) -> list[int]:
    """Live (not zombie) processes of session ``sid``."""
    pids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(") ", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[0] != "Z" and int(fields[3]) == sid:  # state, ppid, pgrp, session
            pids.append(int(stat.parent.name))
    return pids


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def _parent(pid: int) -> int:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1].split()[1])
    except (OSError, IndexError):
        return 0


def session_ranks(sid: int) -> list[int]:
    """The session's ranks and workers: multiprocessing children started by ``spawn``
    (``spawn_main``) or forked by a forkserver (a forkserver's child; the server aside)."""
    out = []
    for pid in session_members(sid):
        cmd = _cmdline(pid)
        if b"spawn_main" in cmd or (
            b"forkserver" in cmd and b"forkserver" in _cmdline(_parent(pid))
        ):
            out.append(pid)
    return out
