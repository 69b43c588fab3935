"""PipelineRunner on every rank, checked against one process running every stage.

Shared by the runtime tests (``test_runner``, ``test_v_memory_runtime``): :func:`pipeline_rank`
runs on each gloo rank, :func:`check_against_reference` compares what the ranks returned with
:func:`nobubble.pipeline.reference.reference_step` on the same model (``torch_model``).
"""

from __future__ import annotations

import pytest
import torch

from nobubble.pipeline import CostModel, get_schedule
from nobubble.pipeline.actions import Schedule
from nobubble.pipeline.reference import reference_step
from nobubble.pipeline.runtime.runner import PipelineRunner
from tests.pipeline.runtime.torch_model import loss_fn, stages

NUM_MB = 4


def schedule(name: str, num_ranks: int) -> Schedule:
    return get_schedule(
        name, num_ranks=num_ranks, num_microbatches=NUM_MB, costs=CostModel.uniform(num_ranks)
    )


def pipeline_rank(ctx, names: tuple[str, ...], xs: list, ys: list) -> dict:
    """On one rank: per schedule name, ``(loss, this rank's gradients, split reports)``."""
    out = {}
    for name in names:
        sched = schedule(name, ctx.world_size)
        runner = PipelineRunner(stages(sched.num_stages), sched, loss_fn)
        loss = runner.step(list(xs), list(ys))
        grads = {
            f"{s}.{n}": p.grad.clone()
            for s, m in runner.stage_modules.items()
            for n, p in m.named_parameters()
        }
        out[name] = (float(loss), grads, runner.split_report())
        runner.close()
    return out


def check_against_reference(results: list[dict], names, num_ranks: int, xs: list, ys: list) -> None:
    """The loss on every rank and the gradients gathered over the ranks equal the reference's;
    every weight gradient went where the schedule's B/W split says it goes."""
    for name in names:
        num_stages = schedule(name, num_ranks).num_stages
        ref_loss, ref_grads = reference_step(stages(num_stages), xs, ys, loss_fn)
        got: dict[str, torch.Tensor] = {}
        for r in results:
            got.update(r[name][1])
            assert r[name][0] == pytest.approx(ref_loss, rel=1e-6), (name, "loss on every rank")
            split_bw = any(a.op.value == "W" for acts in schedule(name, num_ranks).rank_actions
                           for a in acts)  # fmt: skip
            for rep in r[name][2].values():
                assert rep.by_stage_graph == 0, (name, rep)
                if split_bw:  # every weight gradient waited for W
                    assert rep.deferred_fraction == 1.0 and rep.by_fused_backward == 0, (name, rep)
                else:  # fused BW: one walk, the linears' products right after
                    assert rep.by_linear + rep.by_fused_backward == rep.num_params, (name, rep)
        assert set(got) == set(ref_grads), name
        for key, ref in ref_grads.items():
            torch.testing.assert_close(got[key], ref, rtol=1e-5, atol=1e-7, msg=f"{name} {key}")
