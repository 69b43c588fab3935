"""``ep bench|balance|train`` refuse a bad flag before they import torch (issue #38).

torch takes seconds to import; a refusal must not wait for it. The command group, the configs
it builds (``BenchConfig``, ``TrainConfig``) and the placement checks ``ep balance`` runs first
live in modules that import no torch: checked in a fresh interpreter (this one has torch
already). The long tier times five refusals through a real ``python -m nobubble``, start-up
included.
"""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

TORCH_FREE = (
    "nobubble.cli.ep",
    "nobubble.bench.ep_config",
    "nobubble.moe.layout",
    "nobubble.moe.balance.problem",
)


def test_the_ep_commands_and_their_checks_import_no_torch() -> None:
    code = (
        f"import sys, {', '.join(TORCH_FREE)}\n"
        "heavy = sorted(m for m in sys.modules if m.split('.')[0] == 'torch')\n"
        "assert not heavy, heavy[:3]\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr


BIG = str(10**9)
REFUSED = [
    (["ep", "bench", "--ranks", "1"], "--ranks 1"),
    (["ep", "bench", "--warmup", BIG], "--warmup"),
    (["ep", "balance", "--experts", BIG, "--gpus", "8"], "placements"),
    (["ep", "train", "--steps", BIG], "--steps"),
    (["ep", "train", "--experts", str(10**6)], "GiB"),
]


@pytest.mark.long
@pytest.mark.parametrize(("argv", "needle"), REFUSED, ids=[" ".join(a) for a, _ in REFUSED])
def test_a_refusal_takes_under_2_s_start_up_included(tmp_path, argv, needle) -> None:
    start = time.monotonic()
    out = subprocess.run([sys.executable, "-m", "nobubble", *argv], capture_output=True,
                         text=True, timeout=60, cwd=tmp_path)  # fmt: skip
    took = time.monotonic() - start
    lines = out.stderr.splitlines()
    assert out.returncode == 2 and len(lines) == 1 and out.stdout == "", out
    assert needle in lines[0], lines
    assert took < 2, f"{argv}: refused after {took:.1f} s (torch imported before the check?)"
