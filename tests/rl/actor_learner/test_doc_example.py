"""The docs' "bring your own multi-turn text environment" example runs as written and learns.

Like ``tests/test_readme_examples.py`` for the README: the Python block under the heading
is written to a file and run as a script of its own (its actors are processes).
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import gymnasium  # noqa: F401 - a hard dependency: a broken install fails here

DOC = Path(__file__).resolve().parents[3] / "docs" / "rl" / "actor-learner.md"
HEADING = "## Bring your own multi-turn text environment"


def _example() -> str:
    text = DOC.read_text()
    assert HEADING in text, f"{DOC.name} has no section {HEADING!r}"
    blocks = re.findall(r"```python\n(.*?)```", text.split(HEADING, 1)[1], re.S)
    assert blocks, f"no Python block under {HEADING!r}"
    return blocks[0]


def test_the_own_text_env_example_is_short_and_runs(tmp_path: Path) -> None:
    code = _example()
    assert len(code.strip().splitlines()) <= 30
    script = tmp_path / "example.py"
    script.write_text(code)
    out = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=180, cwd=tmp_path
    )
    assert out.returncode == 0, f"example failed:\n{code}\n--- stderr ---\n{out.stderr}"
    m = re.search(r"mean return ([\d.]+) \(of 3\)", out.stdout)
    assert m is not None, out.stdout
    assert float(m.group(1)) >= 2.5, out.stdout  # chance: about 0.1 (1 digit in 11 actions)
