"""Launch pipeline training on local processes (:func:`run_local`: every config checked before
any process starts, then one :func:`nobubble.distributed.spawn`) or under torchrun
(:func:`run_torchrun`). :class:`LaunchOptions` is :mod:`nobubble.distributed.options`'s.
:func:`run_profiled` is ``pp run``'s one call on local ranks (profile, reschedule, run,
summarise, write the trace and plot); :func:`run_torchrun_traced` its call under torchrun.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import torch.distributed as dist

from nobubble.distributed import context_from_env, spawn
from nobubble.distributed.context import torchrun_rank
from nobubble.distributed.options import LaunchOptions
from nobubble.files import claim_output
from nobubble.pipeline.runtime.executor import (
    RankResult,
    TrainConfig,
    check_config,
    train_rank_many,
)
from nobubble.trace import merge_timelines, write_chrome_trace

if TYPE_CHECKING:
    from nobubble.pipeline.runtime.report import RunSummary
    from nobubble.pipeline.setting import PipelineSetting

__all__ = ["LaunchOptions", "run_local", "run_torchrun", "run_profiled", "run_torchrun_traced"]


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


def run_profiled(
    config: TrainConfig,
    options: LaunchOptions,
    *,
    trace: Path,
    predict: bool = True,
    clock: str = "wall",
    setting: PipelineSetting | None = None,
    plot: Path | None = None,
    progress: Callable[[str], object] = lambda _: None,
) -> tuple[RunSummary, dict[str, str]]:
    """Profile ``config``'s model on its stages (``predict``; ``clock`` as
    :func:`~nobubble.pipeline.runtime.profile.profile_stages`'s) and, when ``setting`` names a
    cost-dependent schedule, build it again for the measured costs; run on local ranks, write
    the merged Chrome trace at ``trace`` and (``plot``) the last step measured above the
    simulated one. Returns the summary (with the prediction when profiled) and the files
    written, ``{"trace": path[, "plot": path]}``. Raises as :func:`run_local`."""
    from nobubble.pipeline.runtime.report import simulate_run, summarize_run
    from nobubble.pipeline.schedules import COST_DEPENDENT_SCHEDULES

    prof = None
    if predict:
        from nobubble.pipeline.runtime.profile import profile_stages

        progress(f"profiling {config.schedule.num_stages} stages of {config.model.name}")
        prof = profile_stages(
            config.model, config.schedule.num_stages, microbatch_size=config.microbatch_size,
            device=options.device, backend=options.backend, repeats=3, clock=clock,
            threads=options.threads_per_rank, comm=True, timeout_s=options.timeout_s,
        )  # fmt: skip
        if setting is not None and setting.schedule in COST_DEPENDENT_SCHEDULES:
            config = dataclasses.replace(config, schedule=setting.build(prof.cost_model()))
    progress(f"running {config.schedule.name} on {config.schedule.num_ranks} ranks")
    (results,) = run_local([config], options)
    write_chrome_trace(trace, merge_timelines([r.events for r in results]))  # by start time
    files = {"trace": str(trace)}
    if plot is not None:
        from nobubble.pipeline.runtime.plot_run import plot_measured_vs_simulated

        sim = simulate_run(config, prof) if prof is not None else None
        step = config.num_steps - 1
        files["plot"] = str(plot_measured_vs_simulated(plot, results, sim, step=step))
    return summarize_run(config, results, prof), files


def run_torchrun_traced(
    config: TrainConfig, options: LaunchOptions, trace: Path
) -> tuple[RankResult, Path]:
    """This rank's :func:`run_torchrun` of ``config``, its events written to its own Chrome
    trace (``trace`` with ``.rankR`` before the suffix, claimed before the rank starts);
    the result and that path."""
    rank, _ = torchrun_rank("run_torchrun_traced")  # before the trace is claimed
    path = trace.with_name(f"{trace.stem}.rank{rank}{trace.suffix}")
    with claim_output(path):
        (res,) = run_torchrun([config], options)  # destroys its process group
        write_chrome_trace(path, res.events)
    return res, path
