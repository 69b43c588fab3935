"""examples/rl_cartpole.py runs as a user runs it, to a small target, and learns."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import gymnasium  # noqa: F401 - a hard dependency: a broken install fails here

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "rl_cartpole.py"


def test_the_cartpole_example_reaches_a_small_target() -> None:
    cmd = [sys.executable, str(EXAMPLE), "--arch", "sample-factory", "--target", "150",
           "--seconds", "60"]  # fmt: skip
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stderr
    m = re.search(r"eval return ([\d.]+) after \d+ steps.*ledger ok: True", out.stdout)
    assert m is not None, out.stdout
    assert float(m.group(1)) >= 150, out.stdout
