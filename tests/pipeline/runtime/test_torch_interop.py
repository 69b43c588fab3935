"""to_torch: torch.distributed.pipelining's own runtime executes nobubble's schedules.

The same model of torch's modules as test_runner.py; torch's runtime and PipelineRunner must
both give the single-process gradients for zb-h1, zb-2p, zb-v and an exact (ILP) schedule.
"""

from __future__ import annotations

import pytest
import torch

from nobubble.distributed import spawn
from nobubble.pipeline import CostModel, get_schedule, solve_optimal
from nobubble.pipeline.reference import reference_step
from nobubble.pipeline.runtime.runner import PipelineRunner
from nobubble.pipeline.runtime.torch_interop import to_torch
from tests.pipeline.runtime.torch_model import batch, loss_fn, stages

NUM_MB = 4


def _schedules():
    ilp = solve_optimal(CostModel.uniform(2, t_f=2, t_b=2, t_w=1), num_stages=2,
                        num_microbatches=NUM_MB, time_limit_s=20).schedule  # fmt: skip
    named = {
        n: get_schedule(n, num_ranks=2, num_microbatches=NUM_MB, costs=CostModel.uniform(2))
        for n in ("zb-h1", "zb-2p")
    }
    return {**named, "zb-v": get_schedule("zb-v", num_ranks=2, num_microbatches=NUM_MB), "ilp": ilp}


def _both_paths(ctx, scheds: dict, xs, ys) -> dict:
    x, y = torch.cat(xs), torch.cat(ys)
    out = {}
    for name, sched in scheds.items():
        own = sched.stages_of(ctx.rank)
        for path in ("torch", "nobubble"):
            mods = stages(sched.num_stages)
            if path == "torch":
                runtime = to_torch(mods, sched, loss_fn)
                kwargs = {"target": y} if sched.num_stages - 1 in own else {}
                runtime.step(*((x,) if 0 in own else ()), **kwargs)
            else:
                runner = PipelineRunner(mods, sched, loss_fn)
                runner.step(x, y)
                runner.close()
            out[(name, path)] = {
                f"{s}.{n}": p.grad.clone() for s in own for n, p in mods[s].named_parameters()
            }
    return out


def test_torch_runtime_and_runner_give_the_single_process_gradients() -> None:
    x, y = batch(8, 6)
    xs, ys = list(x.chunk(NUM_MB)), list(y.chunk(NUM_MB))
    scheds = _schedules()
    results = spawn(_both_paths, 2, args=(scheds, xs, ys), timeout_s=240)
    for name, sched in scheds.items():
        _, ref = reference_step(stages(sched.num_stages), xs, ys, loss_fn)
        for path in ("torch", "nobubble"):
            got = {k: v for r in results for k, v in r[(name, path)].items()}
            assert set(got) == set(ref), (name, path)
            for key, want in ref.items():
                torch.testing.assert_close(got[key], want, rtol=1e-5, atol=1e-7,
                                           msg=f"{name} {path} {key}")  # fmt: skip


def test_to_torch_refuses_a_stage_count_that_is_not_the_schedules() -> None:
    sched = get_schedule("zb-h1", num_ranks=2, num_microbatches=NUM_MB)
    with pytest.raises(ValueError, match="1 stage modules for schedule 'zb-h1' with 2 stages"):
        to_torch(stages(2)[:1], sched, loss_fn)
