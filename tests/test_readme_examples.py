"""Every Python example on the README's front page runs as written, as a script of its own."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"
EXAMPLES = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)


def test_the_readme_has_an_example_per_part() -> None:
    joined = "\n".join(EXAMPLES)
    for part in ("nobubble.pipeline", "nobubble.moe", "nobubble.rl", "nobubble.algorithms"):
        assert f"from {part}" in joined, f"README.md has no example importing {part}"


@pytest.mark.parametrize("code", EXAMPLES, ids=[f"example{i}" for i in range(len(EXAMPLES))])
def test_readme_example_runs(code: str, tmp_path) -> None:
    script = tmp_path / "example.py"  # a file, so that spawned ranks can import its functions
    script.write_text(code)
    out = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=300, cwd=tmp_path
    )
    assert out.returncode == 0, f"README example failed:\n{code}\n--- stderr ---\n{out.stderr}"
