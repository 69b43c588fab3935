"""Outputs: refused before any work when they cannot be written; written atomically."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from nobubble.files import atomic_path, check_output_dir, check_output_file, write_text


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
        ["trace", "merge", "a.json", "-o", "/proc/x.json"],
        ["demo", "--out", "/proc/x"],
    ],
)
def test_every_command_refuses_an_unwritable_output_before_working(argv: list[str]) -> None:
    start = time.perf_counter()
    out = subprocess.run(
        [sys.executable, "-m", "nobubble", *argv], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 2, out.stderr
    assert len(out.stderr.strip().splitlines()) == 1 and "/proc" in out.stderr, out.stderr
    assert time.perf_counter() - start < 10  # refused at parse time, no work done
