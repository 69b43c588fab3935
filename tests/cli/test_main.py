"""The command line: help, version, JSON output, one-line errors with exit status 2."""

from __future__ import annotations

import json
import subprocess
import sys

from nobubble import __version__
from nobubble.cli import main
from nobubble.trace import Event, write_chrome_trace


def run(*argv):
    return subprocess.run(
        [sys.executable, "-m", "nobubble", *argv], capture_output=True, text=True, timeout=120
    )


def test_help_and_version():
    r = run("--help")
    assert r.returncode == 0 and "trace" in r.stdout and "demo" in r.stdout
    r = run("--version")
    assert r.returncode == 0 and r.stdout.strip() == f"nobubble {__version__}"


def test_bad_arguments_exit_2_with_one_line():
    r = run("no-such-command")
    assert r.returncode == 2
    assert len(r.stderr.strip().splitlines()) == 1 and "invalid choice" in r.stderr
    for path, needle in [("missing.json", "missing.json: no such file"),
                         ("/", "/ is a folder; give a file"),
                         ("/dev/null", "/dev/null is not a regular file")]:  # fmt: skip
        for command in ("merge", "summary"):
            r = run("trace", command, path, *(["-o", "x.json"] if command == "merge" else []))
            assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
            assert needle in r.stderr and "Traceback" not in r.stderr


def test_trace_merge_json(tmp_path, capsys):
    a = write_chrome_trace(tmp_path / "a.json", [Event("F0", "F", 0, 0.0, 10.0)])
    b = write_chrome_trace(
        tmp_path / "b.json", [Event("F0", "F", 1, 12.0, 10.0), Event("B0", "B", 1, 22.0, 5.0)]
    )
    out = tmp_path / "all.json"
    assert main(["trace", "merge", str(a), str(b), "-o", str(out), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["num_events"] == 3
    assert [r["rank"] for r in report["ranks"]] == [0, 1]
    merged = json.loads(out.read_text())
    assert [e["ts"] for e in merged["traceEvents"] if e["ph"] == "X"] == [0.0, 12.0, 22.0]
    assert main(["trace", "summary", str(out)]) == 0
    assert "rank" in capsys.readouterr().out


def test_demo_merge_and_trace_steps(tmp_path, capsys):
    assert main(["demo", "--quick", "--only", "merge,trace", "--out", str(tmp_path)]) == 0
    text = capsys.readouterr().out
    assert "[1, 1, 2, 3, 4, 4, 5, 6]" in text
    assert (tmp_path / "trace" / "merged.json").exists()
    assert main(["demo", "--only", "nope", "--out", str(tmp_path)]) == 2
