"""The launch paths users run: ``torchrun`` on one host, and two torchrun agents meeting on
127.0.0.1 as two "hosts". Each result must equal the local spawner's, bit for bit."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from nobubble.distributed import free_port, spawn

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from ep_script import ep_round  # noqa: E402

TORCHRUN = shutil.which("torchrun", path=str(Path(sys.executable).parent)) or "torchrun"
TIMEOUT_S = 180


def _env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


def _check(proc: subprocess.CompletedProcess) -> None:
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]


def _results(out_dir: Path, world: int) -> list[dict]:
    return [torch.load(out_dir / f"rank{r}.pt") for r in range(world)]


def _same(launched: list[dict], spawned: list[dict]) -> None:
    for a, b in zip(launched, spawned, strict=True):
        assert a["rank"] == b["rank"] and a["world"] == b["world"] and a["kind"] == b["kind"]
        assert torch.equal(a["out"], b["out"]), a["rank"]


def test_torchrun_standalone_ep_equals_spawn(tmp_path: Path) -> None:
    cmd = [TORCHRUN, "--standalone", "--nproc-per-node", "2", str(HERE / "ep_script.py"),
           str(tmp_path), "2"]  # fmt: skip
    _check(subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT_S, env=_env()))
    _same(_results(tmp_path, 2), spawn(ep_round, 2, args=(2,), timeout_s=TIMEOUT_S))


def test_two_torchrun_agents_on_loopback_run_the_hierarchical_path(tmp_path: Path) -> None:
    port = free_port()
    agents = []
    for node in range(2):
        cmd = [TORCHRUN, "--nnodes", "2", "--nproc-per-node", "1", "--node-rank", str(node),
               "--master-addr", "127.0.0.1", "--master-port", str(port),
               str(HERE / "ep_script.py"), str(tmp_path), "1"]  # fmt: skip
        agents.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                       text=True, env=_env()))  # fmt: skip
    try:
        outs = [a.communicate(timeout=TIMEOUT_S)[0] for a in agents]
    finally:
        for a in agents:
            if a.poll() is None:
                a.kill()
                a.wait()
    for a, out in zip(agents, outs, strict=True):
        assert a.returncode == 0, out[-3000:]
    launched = _results(tmp_path, 2)
    assert [r["kind"] for r in launched] == ["hierarchical"] * 2  # one node per agent
    _same(launched, spawn(ep_round, 2, args=(1,), timeout_s=TIMEOUT_S))


@pytest.mark.parametrize("ranks_per_node", [1])
def test_the_hierarchical_round_equals_the_flat_one(ranks_per_node: int) -> None:
    """The two-node path computes what the flat buffer computes (up to combine's order)."""
    hier = spawn(ep_round, 2, args=(ranks_per_node,), timeout_s=TIMEOUT_S)
    flat = spawn(ep_round, 2, args=(2,), timeout_s=TIMEOUT_S)
    for h, f in zip(hier, flat, strict=True):
        torch.testing.assert_close(h["out"], f["out"], rtol=1e-6, atol=1e-6)


PP_ARGS = ["pp", "run", "-s", "zb-h1", "-p", "2", "-m", "4", "--steps", "3", "--layers", "2",
           "--hidden", "32", "--seq-len", "16", "--no-predict", "--json"]  # fmt: skip


def test_torchrun_pp_run_equals_the_local_spawner(tmp_path: Path) -> None:
    import json

    nobubble = [sys.executable, "-m", "nobubble"]
    local = subprocess.run([*nobubble, *PP_ARGS, "--trace", str(tmp_path / "local.json")],
                           capture_output=True, text=True, timeout=TIMEOUT_S, env=_env())  # fmt: skip
    _check(local)
    cmd = [TORCHRUN, "--standalone", "--nproc-per-node", "2", "-m", "nobubble", *PP_ARGS,
           "--trace", str(tmp_path / "run.json")]  # fmt: skip
    launched = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT_S, env=_env())
    _check(launched)
    got = json.loads(launched.stdout)  # one document: the last stage's rank speaks
    want = json.loads(local.stdout)
    assert got["rank"] == 1 and len(got["losses"]) == 3
    assert got["losses"] == want["losses"]  # same seeds, same schedule: the same numbers
    assert (tmp_path / "run.rank0.json").exists() and (tmp_path / "run.rank1.json").exists()
