"""Outputs: refused before any work when they cannot be written; written atomically."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from nobubble.files import (
    atomic_path,
    check_output_dir,
    check_output_file,
    claim_output,
    write_text,
)
from tests.support.wait import wait_for

ROOT = Path(__file__).resolve().parents[1]


def test_a_failed_write_leaves_the_old_file(tmp_path: Path) -> None:
    target = tmp_path / "trace.json"
    target.write_text("old")
    with pytest.raises(RuntimeError, match="killed"), atomic_path(target) as tmp:
        tmp.write_text("half of the new cont")  # the writer dies mid-way
        raise RuntimeError("killed")
    assert target.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["trace.json"]  # no temporary left
    write_text(target, "new")
    assert target.read_text() == "new"


_WRITER = """
import sys
from pathlib import Path
from nobubble.files import write_text

target, size = Path(sys.argv[1]), int(sys.argv[2])
Path(sys.argv[3]).write_text("ready")
for i in range(10**9):  # until killed: whole files of one letter, the letter changing
    write_text(target, "AB"[i % 2] * size)
"""


def test_a_writer_killed_mid_write_leaves_a_whole_file(tmp_path: Path) -> None:
    """SIGKILL a process that keeps rewriting a 4 MB file, at 8 different moments: the file
    is always one whole version (one letter, full length), never a truncated or mixed one."""
    script, target, ready = tmp_path / "w.py", tmp_path / "out.txt", tmp_path / "ready"
    script.write_text(_WRITER)
    size = 4 << 20
    for delay in (0.05, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.7):
        ready.unlink(missing_ok=True)
        proc = subprocess.Popen([sys.executable, str(script), str(target), str(size), str(ready)])
        try:

            def wrote(proc: subprocess.Popen = proc) -> bool:  # one whole file written
                assert proc.poll() is None, "the writer died"
                return target.exists() and ready.exists()

            wait_for(wrote, timeout_s=300, what="the writer writes", poll_s=0.01)
            time.sleep(delay)
            proc.kill()
            proc.wait(timeout=10)
        finally:
            if proc.poll() is None:
                proc.kill()
        text = target.read_text()
        assert len(text) == size and set(text) in ({"A"}, {"B"}), (delay, len(text), set(text))


_STUCK_WRITER = """
import sys, time
from pathlib import Path
from nobubble.files import atomic_path

with atomic_path(Path(sys.argv[1])) as tmp:
    tmp.write_text("half of it")
    Path(sys.argv[2]).write_text(str(tmp))
    time.sleep(600)  # killed here, mid-write: no cleanup runs
"""


def test_the_next_write_removes_what_a_killed_writer_left(tmp_path: Path) -> None:
    script, target, ready = tmp_path / "w.py", tmp_path / "trace.json", tmp_path / "ready"
    script.write_text(_STUCK_WRITER)
    proc = subprocess.Popen([sys.executable, str(script), str(target), str(ready)])
    try:
        wait_for(ready.exists, timeout_s=120, what="the writer starts", poll_s=0.05)
        left = Path(ready.read_text())
        proc.kill()
        proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert left.exists() and not target.exists()  # the killed write's temporary is left
    write_text(tmp_path / "other.json", "x")  # another target's write leaves it alone
    assert left.exists()
    with atomic_path(target) as mine:  # the next write to the target removes it
        mine.write_text("mine")
        assert not left.exists()
        write_text(target, "meanwhile")  # a live writer's temporary is never swept
        assert mine.exists()
    assert target.read_text() == "mine"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["other.json", "ready", "trace.json",
                                                          "w.py"]  # fmt: skip


@pytest.mark.parametrize(
    ("path", "message"),
    [
        ("/proc/x.png", "cannot create files in /proc"),
        ("/dev/null", "is not a regular file"),
        ("/etc/hostname/x.json", "is a file, not a folder"),
    ],
)
def test_unwritable_files_are_named(path: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        check_output_file(path)


def test_a_folder_is_not_a_file_and_a_file_is_not_a_folder(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="is a folder; give a file name"):
        check_output_file(tmp_path)
    (tmp_path / "f").write_text("x")
    with pytest.raises(ValueError, match="is a file; give a folder"):
        check_output_dir(tmp_path / "f")
    assert check_output_dir(tmp_path / "new" / "deeper") == tmp_path / "new" / "deeper"
    assert not (tmp_path / "new").exists()  # checking creates nothing


@pytest.mark.parametrize(
    "argv",
    [
        ["pp", "simulate", "--plot", "/proc/x.png"],
        ["pp", "simulate", "--trace", "/proc/x.json"],
        ["pp", "export", "-o", "/proc/x.csv"],
        ["pp", "compare", "--plot", "/proc/x.png"],
        ["pp", "solve", "--csv", "/proc/x.csv"],
        ["pp", "profile", "-o", "/proc/x.json"],
        ["pp", "plan", "-o", "/proc/x.csv"],
        ["pp", "run", "-s", "1f1b", "-p", "2", "--trace", "/proc/x.json"],
        ["ep", "bench", "--plot", "/proc/x.png"],
        ["ep", "train", "--plot", "/proc/x.png"],
        ["rl", "train", "--checkpoint-dir", "/proc/x"],
        ["ep", "balance", "--plot", "/proc/x.png"],
        ["rl", "train", "--out", "/proc/x"],
        ["trace", "merge", "pyproject.toml", "-o", "/proc/x.json"],  # an input that exists
        ["demo", "--out", "/proc/x"],
    ],
)
def test_every_command_refuses_an_unwritable_output_before_working(
    argv: list[str], tmp_path: Path
) -> None:
    argv = [str(ROOT / a) if a == "pyproject.toml" else a for a in argv]
    out = subprocess.run(  # in its own folder: the other, default outputs are claimed there
        [sys.executable, "-m", "nobubble", *argv], capture_output=True, text=True, timeout=300,
        cwd=tmp_path,
    )  # fmt: skip
    assert out.returncode == 2, out.stderr
    assert len(out.stderr.strip().splitlines()) == 1 and "/proc" in out.stderr, out.stderr
    assert out.stdout == "", out.stdout  # refused before any work: no progress, no table


def test_a_claim_is_held_for_the_run_and_removed_after(tmp_path: Path) -> None:
    out, lock = tmp_path / "new" / "t.json", tmp_path / "new" / ".t.json.lock"
    with claim_output(out) as claimed:
        assert claimed == out and lock.read_text().strip() == str(os.getpid())
    assert not lock.exists()
    with pytest.raises(RuntimeError, match="failed"), claim_output(out):
        raise RuntimeError("failed")
    assert not lock.exists()  # also on an exception
    with claim_output(out):
        lock.write_text("1\n")  # no longer ours (another run took it over): left alone
    assert lock.read_text() == "1\n"


def test_another_live_runs_claim_is_refused_a_dead_ones_taken_over(tmp_path: Path) -> None:
    out, lock = tmp_path / "t.json", tmp_path / ".t.json.lock"
    sleeper = subprocess.Popen(["sleep", "30"])
    try:
        lock.write_text(f"{sleeper.pid}\n")
        refused = pytest.raises(ValueError, match=rf"another live run \(pid {sleeper.pid}\)")
        with refused, claim_output(out):
            pytest.fail("the work ran under another live run's claim")
        assert lock.read_text() == f"{sleeper.pid}\n"  # the live claim is untouched
        hour_ago = time.time() - 3600  # written before the process started: its pid reused
        os.utime(lock, (hour_ago, hour_ago))
        with claim_output(out):
            assert lock.read_text().strip() == str(os.getpid())
    finally:
        sleeper.kill()
        sleeper.wait()
    lock.write_text(f"{sleeper.pid}\n")  # a finished process: a stale claim
    with claim_output(out):
        assert lock.read_text().strip() == str(os.getpid())
    assert not lock.exists()
    lock.write_text("")  # a claimant that died before writing its pid
    with claim_output(out, wait_s=0.1):
        assert lock.read_text().strip() == str(os.getpid())


@pytest.mark.parametrize("extra", [[], ["--ablation", "--etas", "8"]])
def test_rl_compare_refuses_a_live_runs_folder_before_any_run(tmp_path: Path, extra) -> None:
    out, lock = tmp_path / "o", tmp_path / ".o.lock"
    sleeper = subprocess.Popen(["sleep", "30"])
    try:
        lock.write_text(f"{sleeper.pid}\n")
        argv = [sys.executable, "-m", "nobubble", "rl", "compare", "--steps", "2",
                "--out", str(out), *extra]  # fmt: skip
        done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    finally:
        sleeper.kill()
        sleeper.wait()
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and f"another live run (pid {sleeper.pid})" in lines[0], done.stderr
    assert not out.exists()  # nothing ran, nothing was written


PP_RUN = ["pp", "run", "-s", "1f1b", "-p", "2", "-m", "4", "--steps", "5000", "--layers", "2",
          "--hidden", "16", "--seq-len", "8", "--no-predict"]  # fmt: skip


def test_a_second_run_onto_a_live_runs_output_is_refused(tmp_path: Path) -> None:
    trace = tmp_path / "t.json"
    argv = [sys.executable, "-m", "nobubble", *PP_RUN, "--trace", str(trace)]
    first = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                             text=True, start_new_session=True)  # fmt: skip
    try:

        def claimed() -> bool:
            assert first.poll() is None, first.communicate()
            return (tmp_path / ".t.json.lock").exists()

        wait_for(claimed, timeout_s=300, what="the first run claims its trace")
        os.killpg(first.pid, signal.SIGSTOP)  # alive and holding its claim, not computing
        second = subprocess.run(argv, capture_output=True, text=True, timeout=60)
        assert second.returncode == 2, second.stderr
        lines = second.stderr.strip().splitlines()
        assert len(lines) == 1 and str(trace) in lines[0], second.stderr
        assert f"another live run (pid {first.pid})" in lines[0], second.stderr
        assert first.poll() is None  # the first run goes on
    finally:
        os.killpg(first.pid, signal.SIGKILL)
        first.wait(timeout=30)
