"""DualPipeV on PipelineRunner: loss and every gradient equal one process running the whole
model (torch modules, fp32), on 2 and 4 gloo ranks.

The reference is :func:`nobubble.pipeline.reference.reference_step`: ``nn.Sequential(*stages)``
in this process, the mean of the microbatch losses, one ``backward``. The F&B cells run back to back (F, then the fused
backward); the runner has no overlap of the two yet. m = 2p: the reference's minimum, with
every phase present.
"""

from __future__ import annotations

import pytest
import torch

from nobubble.distributed import spawn
from nobubble.pipeline.reference import reference_step
from nobubble.pipeline.runtime.runner import PipelineRunner
from nobubble.pipeline.schedules import get_schedule
from tests.pipeline.runtime.torch_model import batch, loss_fn, stages


def _dualpipev_rank(ctx, sizes: tuple[int, ...], data: dict[int, tuple[list, list]]) -> dict:
    out = {}
    for m in sizes:
        sched = get_schedule("dualpipev", num_ranks=ctx.world_size, num_microbatches=m)
        runner = PipelineRunner(stages(sched.num_stages), sched, loss_fn)
        xs, ys = data[m]
        loss = runner.step(list(xs), list(ys))
        grads = {
            f"{s}.{n}": p.grad.clone()
            for s, mod in runner.stage_modules.items()
            for n, p in mod.named_parameters()
        }
        out[m] = (float(loss), grads)
        runner.close()
    return out


@pytest.mark.parametrize(("num_ranks", "sizes"), [(2, (4,)), (4, (8,))])
def test_dualpipev_matches_one_process(num_ranks: int, sizes: tuple[int, ...]) -> None:
    data = {}
    for m in sizes:
        x, y = batch(2 * m, 6, seed=m)
        data[m] = (list(x.chunk(m)), list(y.chunk(m)))
    results = spawn(_dualpipev_rank, num_ranks, args=(sizes, data), timeout_s=240)
    for m in sizes:
        ref_loss, ref_grads = reference_step(stages(2 * num_ranks), *data[m], loss_fn)
        got: dict[str, torch.Tensor] = {}
        for r in results:
            assert r[m][0] == pytest.approx(ref_loss, rel=1e-6), (m, "loss on every rank")
            assert not set(got) & set(r[m][1]), "a parameter lives on two ranks"
            got.update(r[m][1])
        assert set(got) == set(ref_grads), m
        for key, ref in ref_grads.items():
            torch.testing.assert_close(got[key], ref, rtol=1e-5, atol=1e-7, msg=f"m={m} {key}")
