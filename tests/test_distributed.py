"""The local spawner: real gloo collectives, results by rank, failures that never hang."""

from __future__ import annotations

import os
import time

import pytest
import torch
import torch.distributed as dist

from nobubble.distributed import DistContext, RankFailure, spawn


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
    t0 = time.monotonic()
    with pytest.raises(
        RankFailure, match="rank 1 failed: RuntimeError: boom from rank one"
    ) as info:
        spawn(_raise_on_rank1, 2, timeout_s=60)
    assert info.value.rank == 1 and "Traceback" in info.value.remote_traceback
    assert time.monotonic() - t0 < 30


def test_dead_rank_is_reported():
    with pytest.raises(RankFailure, match="rank 0 died with exit code 7"):
        spawn(_die_on_rank0, 2, timeout_s=60)


def test_bad_world_size():
    with pytest.raises(ValueError, match="world_size=0"):
        spawn(_all_reduce, 0)
