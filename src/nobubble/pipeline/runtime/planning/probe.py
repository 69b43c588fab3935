"""The runtime's own costs, measured on local ranks: what a block profile cannot see.

:func:`measure_runtime` runs :class:`~nobubble.pipeline.runtime.runner.PipelineRunner` on
``num_ranks`` local ranks over stages that compute almost nothing: ``op_overhead_ms`` is
that step over the simulator's step of the same schedule at unit op times (the fixed cost
of each action: dispatch, transport, wake-up); ``comm_ms_per_byte`` is the one-way time of
a boundary-sized tensor beyond a tiny one's, per byte. Both feed
:func:`~nobubble.pipeline.runtime.planning.plan`.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from nobubble.distributed import DistContext, spawn
from nobubble.pipeline.costs import CostModel
from nobubble.pipeline.runtime.profile import measure_comm
from nobubble.pipeline.runtime.runner import PipelineRunner
from nobubble.pipeline.schedules import get_schedule
from nobubble.pipeline.simulate import simulate

__all__ = ["RuntimeCosts", "measure_runtime"]

_WIDTH = 8  # the probe's stages: one (rows, 8) linear each


@dataclass(frozen=True, slots=True)
class RuntimeCosts:
    """What the runtime adds to the blocks' compute (see the module docstring)."""

    op_overhead_ms: float
    comm_ms_per_byte: float


def measure_runtime(
    num_ranks: int = 2,
    boundary_shape: Sequence[int] = (1, 1024),
    *,
    num_microbatches: int | None = None,
    steps: int = 6,
    device: str = "cpu",
    timeout_s: float = 120.0,
) -> RuntimeCosts:
    """Measure the runtime's per-action cost and per-byte transfer time on ``num_ranks``
    local ranks (gloo on CPU, NCCL on CUDA), each with one thread, as ``nobubble.distributed.
    spawn`` runs them; ``boundary_shape`` is a float32 boundary tensor (one microbatch's).

    Raises:
        ValueError: ``num_ranks`` < 2, ``steps`` < 2 or an empty ``boundary_shape``.
        RankFailure: a rank failed or did not answer within ``timeout_s``.
    """
    if not (isinstance(num_ranks, int) and num_ranks >= 2):
        raise ValueError(f"measure_runtime: num_ranks={num_ranks!r}; a pipeline needs >= 2")
    if steps < 2 or not boundary_shape or min(boundary_shape) < 1:
        raise ValueError(f"measure_runtime: steps={steps} must be >= 2 and boundary_shape="
                         f"{tuple(boundary_shape)} a tensor shape")  # fmt: skip
    m = 4 * num_ranks if num_microbatches is None else num_microbatches
    answers = spawn(_probe, num_ranks, args=(m, steps, tuple(boundary_shape)), device=device,
                    timeout_s=timeout_s)  # fmt: skip
    step_ms, tiny_ms, boundary_ms = answers[0]
    sched = get_schedule("1f1b", num_ranks=num_ranks, num_microbatches=m)
    # every action one unit: F = 1 and the fused BW = B + W = 1
    unit = simulate(sched, CostModel.uniform(num_ranks, t_b=0.5, t_w=0.5)).makespan
    nbytes = 4 * math.prod(int(d) for d in boundary_shape)
    return RuntimeCosts(op_overhead_ms=step_ms / unit,
                        comm_ms_per_byte=max(boundary_ms - tiny_ms, 0.0) / nbytes)  # fmt: skip


def _probe(ctx: DistContext, m: int, steps: int, shape: tuple[int, ...]) -> tuple:
    """One rank: the median step of 1F1B over near-empty stages, then two transfers."""
    torch.manual_seed(0)
    p = ctx.world_size
    device = torch.device(ctx.device)
    stages = [nn.Linear(_WIDTH, _WIDTH).to(device) for _ in range(p)]
    sched = get_schedule("1f1b", num_ranks=p, num_microbatches=m)
    runner = PipelineRunner(stages, sched, nn.functional.mse_loss, static_shapes=True,
                            timeout_s=ctx.timeout_s, device=device)  # fmt: skip
    x, y = torch.randn(m, _WIDTH, device=device), torch.randn(m, _WIDTH, device=device)
    times = []
    for _ in range(steps + 1):  # the first step learns the shapes
        dist.barrier()
        t0 = time.perf_counter()
        runner.step(x, y)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        dist.barrier()
        times.append((time.perf_counter() - t0) * 1e3)
    runner.close()
    tiny = measure_comm(ctx, torch.Size((1,)))
    boundary = measure_comm(ctx, torch.Size(shape))
    return statistics.median(times[1:]), tiny, boundary
