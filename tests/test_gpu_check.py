"""scripts/gpu_check.py stays runnable without a GPU: its plan, its CPU rehearsal (every
check really runs, on CPU and gloo), a failing check's row, and the refusal on a machine
without CUDA."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "gpu_check.py"


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True,
                          text=True, timeout=300)  # fmt: skip


def _module():
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["gpu_check"] = mod  # dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


def test_dry_run_lists_every_check_and_the_skip_list() -> None:
    out = _run("--dry-run")
    assert out.returncode == 0, out.stderr
    mod = _module()
    for name, _ in mod.CHECKS:
        assert f"{name}" in out.stdout and "would run" in out.stdout
    for name, why in mod.SKIPPED:
        assert name in out.stdout and why in out.stdout


@pytest.mark.long  # every GPU check on the CPU (30 s); each check's code is tested on its own
def test_cpu_rehearsal_runs_every_check(tmp_path: Path) -> None:
    report = tmp_path / "gpu_check.json"
    out = _run("--device", "cpu", "--json", str(report))
    assert out.returncode == 0, out.stdout + out.stderr
    import json

    results = json.loads(report.read_text())["results"]
    assert [r["name"] for r in results] == [name for name, _ in _module().CHECKS]
    assert all(r["status"] == "pass" for r in results), results


def test_a_failing_check_is_a_fail_row_and_exit_1(monkeypatch, capsys) -> None:
    mod = _module()

    def broken(device: str) -> str:
        raise AssertionError("gradients differ by 0.5")

    monkeypatch.setattr(mod, "CHECKS", (("ok", lambda device: "fine"), ("broken", broken)))
    assert mod.main(["--device", "cpu"]) == 1
    table = capsys.readouterr().out
    assert "| fail" in table and "AssertionError: gradients differ by 0.5" in table
    assert "| pass" in table  # a failure does not stop the other checks


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA device")
def test_without_cuda_it_refuses_in_one_line() -> None:
    out = _run()
    assert out.returncode == 2
    assert out.stderr.strip().count("\n") == 0 and "--dry-run" in out.stderr
