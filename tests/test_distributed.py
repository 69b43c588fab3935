"""The local spawner: real gloo collectives, results by rank, failures that never hang."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from nobubble.distributed import DistContext, RankFailure, spawn
from tests.support.wait import wait_for


def _all_reduce(ctx: DistContext, scale: float):
    t = torch.full((3,), float(ctx.rank + 1)) * scale
    dist.all_reduce(t)
    return {"rank": ctx.rank, "world": ctx.world_size, "sum": t}


def _raise_on_rank1(ctx: DistContext):
    if ctx.rank == 1:
        raise RuntimeError("boom from rank one")
    dist.barrier()  # the other ranks wait here for a peer that never comes
    return ctx.rank


def _die_on_rank0(ctx: DistContext):
    if ctx.rank == 0:
        os._exit(7)
    dist.barrier()
    return ctx.rank


def test_spawn_runs_real_collectives():
    out = spawn(_all_reduce, 3, args=(2.0,), timeout_s=60)
    for r, res in enumerate(out):
        assert res["rank"] == r and res["world"] == 3
        torch.testing.assert_close(res["sum"], torch.full((3,), 12.0))  # 2 * (1 + 2 + 3)


def test_failing_rank_stops_everyone_with_its_error():
    with pytest.raises(
        RankFailure, match="rank 1 failed: RuntimeError: boom from rank one"
    ) as info:  # rank 1's own error, not the launcher's timeout
        spawn(_raise_on_rank1, 2, timeout_s=150)
    assert info.value.rank == 1 and "Traceback" in info.value.remote_traceback


def test_dead_rank_is_reported():
    with pytest.raises(RankFailure, match="rank 0 died with exit code 7"):
        spawn(_die_on_rank0, 2, timeout_s=60)


def test_bad_world_size():
    with pytest.raises(ValueError, match="world_size=0"):
        spawn(_all_reduce, 0)


_LAUNCHER = """
import os, sys, time
from pathlib import Path
from nobubble.distributed import spawn

def rank_main(ctx, folder):
    Path(folder, f"rank{ctx.rank}.pid").write_text(str(os.getpid()))
    time.sleep(120)  # "training" until the launcher is killed

if __name__ == "__main__":
    spawn(rank_main, 2, args=(sys.argv[1],), timeout_s=300)
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    return not (stat.exists() and stat.read_text().split(") ")[-1].startswith("Z"))


@pytest.mark.skipif(sys.platform != "linux", reason="the parent-death signal is Linux's")
def test_ranks_die_with_a_killed_launcher(tmp_path) -> None:
    script = tmp_path / "launcher.py"
    script.write_text(_LAUNCHER)
    launcher = subprocess.Popen([sys.executable, str(script), str(tmp_path)])
    try:
        wait_for(lambda: len(list(tmp_path.glob("rank*.pid"))) == 2, timeout_s=300,
                 what="the ranks start")  # fmt: skip
        pids = [int(p.read_text()) for p in tmp_path.glob("rank*.pid")]
        launcher.send_signal(signal.SIGKILL)
        launcher.wait(timeout=60)
        # the parent-death signal is immediate: the guard only turns a survivor into a failure
        wait_for(lambda: not any(_alive(p) for p in pids), timeout_s=60,
                 what=f"ranks {pids} die with their launcher")  # fmt: skip
    finally:
        if launcher.poll() is None:
            launcher.kill()


def _stop_rank1(ctx: DistContext):
    dist.barrier()
    if ctx.rank == 1:
        os.kill(os.getpid(), signal.SIGSTOP)  # hung: alive, silent
    dist.barrier()  # rank 0 waits here far longer than the watchdog allows
    return ctx.rank


@pytest.mark.long  # the watchdog's real window (liveness_s=4) on a real stopped rank
def test_a_stopped_rank_is_named_by_the_liveness_watchdog():
    # named by the watchdog ("no heartbeat"), not by the 300 s collective timeout
    with pytest.raises(RankFailure, match="rank 1 stopped responding: no heartbeat") as info:
        spawn(_stop_rank1, 2, timeout_s=300, liveness_s=4)
    assert info.value.rank == 1


def test_liveness_is_checked():
    with pytest.raises(ValueError, match="liveness_s=0.5"):
        spawn(_all_reduce, 1, args=(1.0,), liveness_s=0.5)


def test_spawn_creates_no_named_semaphore(monkeypatch):
    """A queue's semaphores outlive a SIGKILLed launcher in /dev/shm; spawn uses pipes."""
    import multiprocessing.synchronize as mps

    made: list[int] = []
    original = mps.SemLock.__init__

    def counting(self, *args, **kwargs):
        made.append(1)
        original(self, *args, **kwargs)

    monkeypatch.setattr(mps.SemLock, "__init__", counting)
    out = spawn(_all_reduce, 2, args=(1.0,), timeout_s=60)
    assert [o["rank"] for o in out] == [0, 1] and made == []
