"""The launcher killed from outside: SIGINT (Ctrl-C), SIGTERM, SIGKILL of `nobubble pp run`.

Every case must leave no process of the run behind within 10 s (the ranks are in the
launcher's session), and Ctrl-C / SIGTERM end with one line and exit 130 / 143.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="reads /proc")

RUN = ["pp", "run", "-s", "1f1b", "-p", "2", "-m", "4", "--steps", "5000", "--layers", "2",
       "--hidden", "16", "--seq-len", "8", "--no-predict"]  # fmt: skip


def _default_sigint() -> None:
    """In the child: SIGINT's default action, even under a suite started in the background
    (whose shell ignores SIGINT, which stays ignored across exec)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _session_members(sid: int) -> list[int]:
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


def _ranks(sid: int) -> list[int]:
    """The session's ranks and workers: multiprocessing children started by ``spawn``
    (``spawn_main``) or forked by a forkserver (a forkserver's child; the server aside)."""
    out = []
    for pid in _session_members(sid):
        cmd = _cmdline(pid)
        if b"spawn_main" in cmd or (
            b"forkserver" in cmd and b"forkserver" in _cmdline(_parent(pid))
        ):
            out.append(pid)
    return out


@pytest.mark.parametrize(("sig", "code", "line"), [
    (signal.SIGINT, 130, "interrupted"),
    (signal.SIGTERM, 143, "terminated"),
    (signal.SIGKILL, -9, None),
])  # fmt: skip
def test_a_signalled_launcher_leaves_nothing_behind(tmp_path, sig, code, line) -> None:
    cmd = [sys.executable, "-m", "nobubble", *RUN, "--trace", str(tmp_path / "t.json")]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, env={**os.environ, "COLUMNS": "200"},
                            preexec_fn=_default_sigint)  # fmt: skip
    try:
        deadline = time.monotonic() + 90
        while len(_ranks(proc.pid)) < 2:  # both ranks started (the resource tracker aside)
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "the ranks never started"
            time.sleep(0.2)
        time.sleep(1.0)  # into the training steps
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=20)
        assert proc.returncode == code, err
        if line is not None:
            last = [x for x in err.splitlines() if x.strip()]
            assert last[-1] == f"nobubble pp: {line}", err
            assert "Traceback" not in err, err
        deadline = time.monotonic() + 10
        while _session_members(proc.pid):
            assert time.monotonic() < deadline, f"left behind: {_session_members(proc.pid)}"
            time.sleep(0.1)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
