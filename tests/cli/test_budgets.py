"""Sizes that cannot finish are refused before any work: one line, exit 2, at once."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

OVERSIZED = [
    (["pp", "simulate", "-p", "100000", "-m", "100000"], "60,000,000,000 ops"),
    (["pp", "show", "-p", "1000", "-m", "1000"], "past this command's budget"),
    (["pp", "export", "-s", "zb-2p", "-p", "2000", "-m", "200"], "2,400,000 ops"),
    (["pp", "compare", "-p", "32", "-m", "512"], "budget of 20,000"),
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
