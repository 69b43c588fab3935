"""Sizes that cannot finish are refused before any work (one line, exit 2, nothing done),
and the sizes a command takes finish within 30 s and 2 GB (the long tier: it times them)."""

from __future__ import annotations

import concurrent.futures
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from nobubble.cli import main

OVERSIZED = [
    (["pp", "simulate", "-p", "100000", "-m", "100000"], "60,000,000,000 ops"),
    (["pp", "show", "-p", "1000", "-m", "1000"], "past the 'default' budget of 1,000,000"),
    (["pp", "export", "-s", "zb-2p", "-p", "2000", "-m", "200"], "2,400,000 ops"),
    (["pp", "compare", "-p", "32", "-m", "512"], "budget of 10,000"),
    (["pp", "export", "-s", "v-zb", "-p", "2", "-m", "66666"], "799,992 ops for the V"),
    (["pp", "simulate", "-s", "v-zb", "-p", "40", "-m", "200"], "ranks x ops"),
    (["pp", "frontier", "-p", "200", "-m", "8"], "ranks x ops"),
    (["pp", "solve", "-p", "64", "-m", "512"], "budget of 50,000"),
    (["pp", "run", "-s", "1f1b", "-p", "64"], "64 processes"),
    (["ep", "bench", "--ranks", "64"], "64 processes"),
    (["ep", "train", "--ranks", "64"], "64 processes"),
    (["rl", "train", "--generators", "64"], "66 processes"),
    (["ep", "bench", "--tokens", "1000000", "--hidden", "7168"], "GiB, past 80%"),
    (["ep", "bench", "--iters", "1000000000"], "--iters 1000000000"),
    (["rl", "train", "--batch-groups", "1000000"], "GiB, past 80%"),
    (["rl", "train", "--group-size", "1000000"], "GiB, past 80%"),
    (["rl", "compare", "--group-size", "1000000"], "GiB, past 80%"),
]


@pytest.mark.parametrize(("argv", "needle"), OVERSIZED, ids=[" ".join(a) for a, _ in OVERSIZED])
def test_oversized_runs_are_refused_before_any_work(
    argv: list[str], needle: str, tmp_path: Path
) -> None:
    out = subprocess.run(  # in its own folder: a default output is claimed before the budget
        [sys.executable, "-m", "nobubble", *argv], capture_output=True, text=True, timeout=300,
        cwd=tmp_path,
    )  # fmt: skip
    assert out.returncode == 2, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0] and "--force" in lines[0], out.stderr
    assert out.stdout == "", out.stdout  # no progress, no table: nothing ran


@pytest.mark.long
def test_oversized_runs_are_refused_within_2_s(capsys) -> None:
    """The timed half (the long tier): each refusal above, in process, under 2 s once the
    command's modules are imported (the interpreter's own start-up is not the command's)."""
    for argv, _ in OVERSIZED:
        main(argv)  # first imports
    capsys.readouterr()
    for argv, _ in OVERSIZED:
        start = time.perf_counter()
        assert main(argv) == 2
        took = time.perf_counter() - start
        assert took < 2, f"{argv}: refused after {took:.1f}s"


def test_force_lets_a_run_past_the_budget_start() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "nobubble", "pp", "simulate", "-s", "1f1b", "-p", "200", "-m",
         "1000", "--force", "--json"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr


SIZED = ["simulate", "show", "export", "compare", "solve", "frontier"]


LOG_SIZE = st.floats(0.3, 6.0).map(lambda e: int(10**e))  # 1 .. a million, log-uniform


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])  # fmt: skip
@given(command=st.sampled_from(SIZED), schedule=st.sampled_from(["1f1b", "zb-2p", "v-zb"]),
       ranks=LOG_SIZE.filter(lambda n: n >= 2), microbatches=LOG_SIZE)  # fmt: skip
def test_any_size_past_a_budget_is_refused_before_any_work_in_one_line(
    capsys, command: str, schedule: str, ranks: int, microbatches: int
) -> None:
    """Sizes drawn up to a million ranks and microbatches: whatever passes the command's
    estimate of its work is refused before any work (exit 2, one line naming --force, nothing
    on stdout); sizes under every estimate are left to the examples above and the suite."""
    ops = 3 * ranks * microbatches  # one chunk per rank: the least any command counts
    v = command == "frontier" or (command in ("simulate", "show", "export") and schedule == "v-zb")
    budget = {"compare": 10_000, "frontier": 10_000, "solve": 50_000}.get(command, 1_000_000)
    assume(ops > budget or (v and (2 * ops > 200_000 or ranks * 2 * ops > 1_600_000)))
    argv = ["pp", command, "-p", str(ranks), "-m", str(microbatches)]
    if command in ("simulate", "show", "export"):
        argv += ["-s", schedule]
    assert main(argv) == 2
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "--force" in lines[0] and out == "", (out, err)


def _run_measured(argv: list[str], timeout_s: float, err: Path) -> tuple[int, float, int]:
    """``nobubble *argv`` in a child, its output into ``err``: (exit status, seconds, the
    child's peak resident bytes, from its own rusage)."""
    start = time.monotonic()
    with err.open("w") as sink:
        proc = subprocess.Popen([sys.executable, "-m", "nobubble", *argv],
                                stdout=sink, stderr=subprocess.STDOUT)  # fmt: skip
    while True:
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            break
        if time.monotonic() - start > timeout_s:
            proc.kill()
            os.wait4(proc.pid, 0)
            proc.returncode = -9
            pytest.fail(f"{argv}: still running after {timeout_s:.0f}s")
        time.sleep(0.05)
    proc.returncode = os.waitstatus_to_exitcode(status)  # reaped here, not by Popen
    return proc.returncode, time.monotonic() - start, usage.ru_maxrss * 1024  # KiB on Linux


def _largest_accepted(command: str, schedule: str, ranks: int) -> int:
    """The most microbatches ``command`` takes at ``ranks`` without --force (the op budget,
    and for the V generators theirs)."""
    budget = {"compare": 10_000, "frontier": 10_000, "solve": 50_000}.get(command, 1_000_000)
    most = budget // (6 * ranks)  # 3 ops x 2 chunks per rank, as check_ops counts
    if command == "frontier" or (command in ("simulate", "show", "export") and schedule == "v-zb"):
        most = min(most, 200_000 // (6 * ranks), 1_600_000 // (6 * ranks * ranks))
    return most


ACCEPTED_LIMIT_S, ACCEPTED_LIMIT_BYTES = 30.0, 2 * 2**30


def _accepted_argv(command: str, schedule: str, ranks: int, microbatches: int) -> list[str]:
    argv = ["pp", command, "-p", str(ranks), "-m", str(microbatches)]
    if command in ("simulate", "show", "export"):
        argv += ["-s", schedule]
    if command == "solve":  # its search runs to the time limit the user gives, not a size
        argv += ["--time-limit", "5"]
    return argv


def _check_finished(argv: list[str], err: Path) -> None:
    """``argv`` ran to the end within 30 s and 2 GB (exit 0; the solver may say it found no
    schedule within its time limit, exit 1)."""
    code, took, peak = _run_measured(argv, ACCEPTED_LIMIT_S, err)
    out = err.read_text()
    assert code == 0 or (argv[1] == "solve" and "within the time limit" in out), (argv, out)
    assert took < ACCEPTED_LIMIT_S and peak < ACCEPTED_LIMIT_BYTES, (argv, took, peak)


# the largest size each command takes, at the rank counts where it costs the most here
LARGEST = [("simulate", "1f1b", 2), ("show", "zb-2p", 16), ("export", "v-zb", 8),
           ("compare", "1f1b", 4), ("solve", "1f1b", 4), ("frontier", "1f1b", 4)]  # fmt: skip


@pytest.mark.long
def test_the_largest_size_of_every_command_finishes_within_30_s_and_2_gb(tmp_path) -> None:
    """The other half at its edge: each command at the largest size it takes. Two run at a
    time (this machine's two cores), so each bound holds with the other core busy too.
    The solver's search time is the user's own (``--time-limit``, 5 s here), not a size."""
    cases = [(_accepted_argv(c, s, p, _largest_accepted(c, s, p)), tmp_path / f"{c}.txt")
             for c, s, p in LARGEST]  # fmt: skip
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        for done in [pool.submit(_check_finished, *case) for case in cases]:
            done.result()


@pytest.mark.long
@settings(max_examples=3, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])  # fmt: skip
@given(command=st.sampled_from(SIZED), schedule=st.sampled_from(["1f1b", "zb-2p", "v-zb"]),
       ranks=st.integers(2, 64), share=st.floats(0.0, 1.0))  # fmt: skip
def test_any_size_under_the_budget_finishes_within_30_s_and_2_gb(
    tmp_path: Path, command: str, schedule: str, ranks: int, share: float
) -> None:
    """The other half: sizes the command takes, drawn log-uniformly up to the largest one
    (which the test above runs for every command), finish within 30 s and 2 GB."""
    largest = _largest_accepted(command, schedule, ranks)
    assume(largest >= 1)
    microbatches = max(1, round(largest**share))
    _check_finished(_accepted_argv(command, schedule, ranks, microbatches), tmp_path / "err.txt")
