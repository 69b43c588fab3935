"""Launch pipeline training on local processes (:func:`run_local`: every config checked before
any process starts, then one :func:`nobubble.distributed.spawn`) or under torchrun
(:func:`run_torchrun`); :func:`merged_events` merges one config's per-rank timelines into
one time-ordered list. :class:`LaunchOptions` is :mod:`nobubble.distributed.options`'s.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch.distributed as dist

from nobubble.distributed import context_from_env, spawn
from nobubble.distributed.options import LaunchOptions
from nobubble.pipeline.runtime.executor import (
    RankResult,
    TrainConfig,
    check_config,
    train_rank_many,
)
from nobubble.trace import Event, merge_timelines

__all__ = ["LaunchOptions", "run_local", "run_torchrun", "merged_events"]


def _world_size(configs: Sequence[TrainConfig]) -> int:
    if not configs:
        raise ValueError("run_local: no configs given; pass at least one TrainConfig")
    world = configs[0].schedule.num_ranks
    for c in configs:
        check_config(c, world)  # raises before any process starts
    return world


def run_local(
    configs: Sequence[TrainConfig], options: LaunchOptions | None = None
) -> list[list[RankResult]]:
    """Run ``configs`` one after another on local ranks; returns ``[config][rank]`` results.

    Raises ValueError (before starting processes) for a bad schedule or model split, and
    :class:`nobubble.distributed.RankFailure` when a rank fails (the others are stopped).
    """
    options = options or LaunchOptions()
    world = _world_size(configs)
    by_rank = spawn(
        train_rank_many, world, args=(list(configs),), backend=options.backend,
        device=options.device, timeout_s=options.timeout_s,
        threads_per_rank=options.threads_per_rank,
    )  # fmt: skip
    return [[by_rank[r][i] for r in range(world)] for i in range(len(configs))]


def run_torchrun(
    configs: Sequence[TrainConfig], options: LaunchOptions | None = None
) -> list[RankResult]:
    """This rank's results under ``torchrun`` (reads RANK, WORLD_SIZE, MASTER_ADDR, ...);
    the process group it joins is destroyed when it returns or raises."""
    options = options or LaunchOptions()
    try:
        ctx = context_from_env(
            device=None if options.device == "cuda" else options.device,
            backend=options.backend,
            timeout_s=options.timeout_s,
        )
        world = _world_size(configs)
        if world != ctx.world_size:
            raise ValueError(f"schedule needs {world} ranks but torchrun started {ctx.world_size}")
        return train_rank_many(ctx, list(configs))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def merged_events(results: Sequence[RankResult]) -> list[Event]:
    """All ranks' events of one config merged by start time."""
    return list(merge_timelines([r.events for r in results]))
