"""Sizes that cannot finish are refused before any work: one line, exit 2, at once."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from nobubble.cli import main

OVERSIZED = [
    (["pp", "simulate", "-p", "100000", "-m", "100000"], "60,000,000,000 ops"),
    (["pp", "show", "-p", "1000", "-m", "1000"], "past this command's budget"),
    (["pp", "export", "-s", "zb-2p", "-p", "2000", "-m", "200"], "2,400,000 ops"),
    (["pp", "compare", "-p", "32", "-m", "512"], "budget of 20,000"),
    (["pp", "simulate", "-s", "v-zb", "-p", "100", "-m", "1600"], "ranks x ops"),
    (["pp", "frontier", "-p", "100", "-m", "30"], "ranks x ops"),
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
def test_oversized_runs_are_refused_at_once(argv: list[str], needle: str) -> None:
    start = time.perf_counter()
    out = subprocess.run(
        [sys.executable, "-m", "nobubble", *argv], capture_output=True, text=True, timeout=60
    )
    took = time.perf_counter() - start
    assert out.returncode == 2, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0] and "--force" in lines[0], out.stderr
    assert took < 10, f"refusal took {took:.1f}s"  # generous: the interpreter starts here too


def test_force_lets_a_run_past_the_budget_start() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "nobubble", "pp", "simulate", "-s", "1f1b", "-p", "200", "-m",
         "1000", "--force", "--json"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr


SIZED = ["simulate", "show", "export", "compare", "solve", "frontier"]


@pytest.fixture(scope="module", autouse=True)
def _commands_imported() -> None:
    """Each command once, so that the timed calls below do not pay for first imports."""
    for command in SIZED:
        main(["pp", command, "-p", "1000000", "-m", "1000000"])


LOG_SIZE = st.floats(0.3, 6.0).map(lambda e: int(10**e))  # 1 .. a million, log-uniform


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])  # fmt: skip
@given(command=st.sampled_from(SIZED), schedule=st.sampled_from(["1f1b", "zb-2p", "v-zb"]),
       ranks=LOG_SIZE.filter(lambda n: n >= 2), microbatches=LOG_SIZE)  # fmt: skip
def test_any_size_past_a_budget_is_refused_at_once_in_one_line(
    capsys, command: str, schedule: str, ranks: int, microbatches: int
) -> None:
    """Sizes drawn up to a million ranks and microbatches: whatever passes the command's
    estimate of its work is refused before any work (exit 2, one line naming --force, well
    under 2 s); sizes under every estimate are left to the examples above and the suite."""
    ops = 3 * ranks * microbatches  # one chunk per rank: the least any command counts
    v_weight = ranks * ops if command == "frontier" or schedule == "v-zb" else 0
    budget = {"compare": 20_000, "frontier": 20_000, "solve": 50_000}.get(command, 1_000_000)
    assume(ops > budget or v_weight > 1_600_000)
    argv = ["pp", command, "-p", str(ranks), "-m", str(microbatches)]
    if command in ("simulate", "show", "export"):
        argv += ["-s", schedule]
    start = time.perf_counter()
    assert main(argv) == 2
    took = time.perf_counter() - start
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--force" in err[0], err
    assert took < 2, f"{argv}: refused after {took:.1f}s"


def test_the_cli_knows_the_v_generators_by_their_names() -> None:
    from nobubble.cli.pp_options import V_MEMORY_SCHEDULES
    from nobubble.pipeline.schedules.v_memory import V_MEMORY_NAMES

    assert V_MEMORY_SCHEDULES == V_MEMORY_NAMES
