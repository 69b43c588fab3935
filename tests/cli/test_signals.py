"""The launcher killed from outside: SIGINT (Ctrl-C), SIGTERM, SIGKILL of `nobubble pp run`.

Every case must leave no process of the run behind (the ranks are in the launcher's
session), and Ctrl-C / SIGTERM end with one line and exit 130 / 143. The long tier bounds it:
the launcher exits within 20 s of the signal and nothing is left 10 s later; ``make test``
runs the Ctrl-C case with hang guards instead.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from tests.cli.session_procs import default_sigint, session_members, session_ranks
from tests.support.wait import tier_bound, wait_for

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="reads /proc")

RUN = ["pp", "run", "-s", "1f1b", "-p", "2", "-m", "4", "--steps", "5000", "--layers", "2",
       "--hidden", "16", "--seq-len", "8", "--no-predict"]  # fmt: skip


@pytest.mark.parametrize(("sig", "code", "line"), [
    (signal.SIGINT, 130, "interrupted"),  # the fast tier's case, with hang guards
    pytest.param(signal.SIGINT, 130, "interrupted", marks=pytest.mark.long, id="SIGINT-timed"),
    pytest.param(signal.SIGTERM, 143, "terminated", marks=pytest.mark.long),
    pytest.param(signal.SIGKILL, -9, None, marks=pytest.mark.long),
])  # fmt: skip
def test_a_signalled_launcher_leaves_nothing_behind(request, tmp_path, sig, code, line) -> None:
    cmd = [sys.executable, "-m", "nobubble", *RUN, "--trace", str(tmp_path / "t.json")]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, env={**os.environ, "COLUMNS": "200"},
                            preexec_fn=default_sigint)  # fmt: skip
    try:

        def started() -> bool:  # both ranks (the resource tracker aside)
            assert proc.poll() is None, proc.communicate()
            return len(session_ranks(proc.pid)) >= 2

        wait_for(started, timeout_s=300, what="both ranks start", poll_s=0.2)
        time.sleep(1.0)  # into the training steps
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=tier_bound(request, 20))
        assert proc.returncode == code, err
        if line is not None:
            last = [x for x in err.splitlines() if x.strip()]
            assert last[-1] == f"nobubble pp: {line}", err
            assert "Traceback" not in err, err
        wait_for(lambda: not session_members(proc.pid), timeout_s=tier_bound(request, 10),
                 what=f"the run's session empties ({session_members(proc.pid)} left)")  # fmt: skip
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
