"""The fault matrix: a rank or worker killed or stopped mid-run, the launcher killed or
interrupted, and two runs of one command at once, for ``pp run``, ``ep bench --transport
shm|dist`` and ``rl train``.

The matrix is the long tier's: each case has a bound on the time from the fault to the
launcher's exit. ``make test`` keeps one case (a killed rank of ``pp run``) with a hang guard
instead of the bound. Each case leaves nothing behind: no process of the run's session (the launcher starts in a session of its own), and
no new ``/dev/shm`` segment named by the run (shared-memory transports, multiprocessing
semaphores). A rank's failure ends the run with exit 1 and one line naming the rank or
worker; Ctrl-C ends it with exit 130 and ``nobubble X: interrupted``, SIGTERM with 143
and ``nobubble X: terminated``.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.cli.session_procs import default_sigint, session_members, session_ranks
from tests.support.wait import wait_for

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="reads /proc and /dev/shm")

EP = ["--ranks", "2", "--iters", "100000", "--force", "--tokens", "64", "--hidden", "32",
      "--experts", "4", "--topk", "2"]  # fmt: skip
COMMANDS = {
    "pp run": ["pp", "run", "-s", "1f1b", "-p", "2", "-m", "4", "--steps", "5000",
               "--layers", "2", "--hidden", "16", "--seq-len", "8", "--no-predict"],
    "ep bench shm": ["ep", "bench", "--transport", "shm", *EP],
    "ep bench dist": ["ep", "bench", "--transport", "dist", *EP],
    "rl train": ["rl", "train", "--mode", "fully-async", "--steps", "100000", "--batch-groups",
                 "2", "--group-size", "4", "--policy-kwargs", '{"hidden": 16}'],
}  # fmt: skip


def _shm() -> set[str]:
    return set(os.listdir("/dev/shm"))


class _Run:
    """One command in its own session, with the run's own output paths."""

    def __init__(self, name: str, tmp: Path) -> None:
        self.name, self.group = name, name.split()[0]
        tmp.mkdir(parents=True, exist_ok=True)
        argv = list(COMMANDS[name])
        if self.group == "pp":
            argv += ["--trace", str(tmp / "trace.json")]
        if self.group == "rl":
            argv += ["--out", str(tmp / "rl")]
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "nobubble", *argv], stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True, start_new_session=True,
            env={**os.environ, "COLUMNS": "200"}, preexec_fn=default_sigint,
        )  # fmt: skip

    def wait_for_ranks(self, count: int = 2) -> list[int]:
        def started() -> list[int] | None:
            assert self.proc.poll() is None, self.proc.communicate()
            ranks = session_ranks(self.proc.pid)
            return ranks if len(ranks) >= count else None

        ranks = wait_for(started, timeout_s=300, what=f"{self.name}: the ranks start", poll_s=0.2)
        time.sleep(2.0)  # into the work
        return ranks

    def finish(self, bound_s: float) -> tuple[int, str, float]:
        """Exit code, stderr and seconds until the launcher exited (at most ``bound_s``)."""
        start = time.monotonic()
        try:
            _, err = self.proc.communicate(timeout=bound_s)
        except subprocess.TimeoutExpired:
            pytest.fail(f"{self.name}: still running {bound_s:.0f}s after the fault")
        return self.proc.returncode, err, time.monotonic() - start

    def assert_nothing_left(self, timeout_s: float = 10.0) -> None:
        wait_for(lambda: not session_members(self.proc.pid), timeout_s=timeout_s,
                 what=f"{self.name}: nothing left behind")  # fmt: skip

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


def _assert_shm_cleaned(before: set[str]) -> None:
    """Within 10 s, nothing new in /dev/shm (multiprocessing's resource tracker unlinks the
    semaphores of a launcher killed outright)."""
    wait_for(lambda: not _shm() - before, timeout_s=10, what="/dev/shm is as before",
             poll_s=0.2)  # fmt: skip


def _last_line(err: str) -> str:
    lines = [x for x in err.splitlines() if x.strip() and "resource_tracker" not in x]
    return lines[-1] if lines else ""


def test_a_killed_rank_of_pp_run_ends_the_run_naming_it(tmp_path) -> None:
    """The fast tier's case of the matrix: the same checks, a hang guard for the bound."""
    _killed_rank_case(tmp_path, "pp run", bound_s=150, check_shm=False, left_s=60)


@pytest.mark.long
@pytest.mark.parametrize("name", list(COMMANDS))
def test_a_killed_rank_or_worker_ends_the_run_naming_it(tmp_path, name) -> None:
    _killed_rank_case(tmp_path, name, bound_s=20)


def _killed_rank_case(tmp_path: Path, name: str, bound_s: float, check_shm: bool = True,
                      left_s: float = 10.0) -> None:  # fmt: skip
    """The run exits within ``bound_s`` of the kill, its session is empty ``left_s`` later;
    ``check_shm`` False: /dev/shm is not compared (other tests of a parallel run write it)."""
    before = _shm()
    run = _Run(name, tmp_path)
    try:
        os.kill(run.wait_for_ranks()[-1], signal.SIGKILL)
        code, err, _ = run.finish(bound_s=bound_s)
        assert code == 1, err
        line = _last_line(err)
        assert "died with exit code -9" in line and "Traceback" not in err, err
        assert line.startswith(f"nobubble {run.group}: failed:"), err
        run.assert_nothing_left(left_s)
        if check_shm:
            assert not {n for n in _shm() - before if not n.startswith("sem.")}, "shm left"
    finally:
        run.kill()


@pytest.mark.long
@pytest.mark.parametrize(("sig", "code", "word"), [
    (signal.SIGINT, 130, "interrupted"), (signal.SIGTERM, 143, "terminated"),
])  # fmt: skip
@pytest.mark.parametrize("name", ["ep bench shm", "rl train"])
def test_ctrl_c_or_sigterm_prints_one_line_and_leaves_nothing(tmp_path, name, sig, code, word):
    before = _shm()
    run = _Run(name, tmp_path)
    try:
        run.wait_for_ranks()
        run.proc.send_signal(sig)
        got, err, _ = run.finish(bound_s=15)
        assert got == code and _last_line(err) == f"nobubble {run.group}: {word}", err
        assert "Traceback" not in err, err
        run.assert_nothing_left()
        _assert_shm_cleaned(before)
    finally:
        run.kill()


@pytest.mark.long
@pytest.mark.parametrize("name", ["ep bench shm", "rl train"])
def test_a_sigkilled_launcher_takes_its_ranks_and_segments_along(tmp_path, name) -> None:
    before = _shm()
    run = _Run(name, tmp_path)
    try:
        run.wait_for_ranks()
        os.kill(run.proc.pid, signal.SIGKILL)  # the launcher alone; its ranks must follow
        run.finish(bound_s=10)  # stderr closes when the last rank or worker is gone
        run.assert_nothing_left()
        _assert_shm_cleaned(before)
    finally:
        run.kill()


@pytest.mark.long
def test_a_stopped_rank_or_worker_is_named_by_liveness_within_45_s(tmp_path) -> None:
    """A SIGSTOPped rank (``ep bench``) and a SIGSTOPped RL worker (``rl train``): both runs
    at once, so that the two liveness waits overlap."""
    runs = {
        name: _Run(name, tmp_path / name.replace(" ", "-")) for name in ("ep bench shm", "rl train")
    }
    try:
        stopped = {name: run.wait_for_ranks()[-1] for name, run in runs.items()}
        for pid in stopped.values():
            os.kill(pid, signal.SIGSTOP)
        code, err, _ = runs["ep bench shm"].finish(bound_s=45)
        line = _last_line(err)
        assert code == 1 and "stopped responding" in line and "rank 1" in line, err
        code, err, _ = runs["rl train"].finish(bound_s=45)
        line = _last_line(err)
        assert code == 1 and re.search(r"(rollout|reward|trainer)\S* stopped responding", line), err
        for run in runs.values():
            run.assert_nothing_left()
    finally:
        for run in runs.values():
            run.kill()


@pytest.mark.long
def test_two_runs_of_one_command_at_once_do_not_clash(tmp_path) -> None:
    """Ports and shared-memory names are per run: two shm benchmarks side by side both
    finish."""
    argv = ["ep", "bench", "--transport", "shm", "--ranks", "2", "--iters", "3", "--tokens",
            "64", "--hidden", "32", "--experts", "4", "--topk", "2", "--json"]  # fmt: skip
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "nobubble", *argv],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=tmp_path,
        )  # fmt: skip
        for _ in range(2)
    ]
    for p in procs:
        _, err = p.communicate(timeout=180)
        assert p.returncode == 0, err
