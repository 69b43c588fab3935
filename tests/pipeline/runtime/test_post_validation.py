"""Post-validation: step first, check the global gradient norm after, roll back if needed.

Two ranks train a small model for 4 steps in which the gradients are kept, clipped (the
global norm exceeds ``max_norm``), and made non-finite on one rank. The post-validated
run's weights must equal the synchronous run's bit for bit after every step, for SGD with
momentum and for AdamW. The synchronous step itself is checked against the global-norm
clipping written out here. As a runner hook (``PipelineRunner(hooks=[post])``, the example
``examples/pp_post_validation.py``) the same equality holds step by step.
"""

from __future__ import annotations

import math
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch import nn

from nobubble.distributed import spawn
from nobubble.pipeline.runtime.optim import PostValidatedOptimizer, synchronous_step

MAX_NORM = 1.0
SCALES = (0.01, 10.0, 1.0, 0.01)  # kept, clipped, (inf on rank 1), kept


def _model() -> nn.Module:
    torch.manual_seed(3)
    return nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2))


def _grads(model: nn.Module, rank: int, step: int) -> None:
    g = torch.Generator().manual_seed(100 * step + rank)
    x, y = torch.randn(6, 4, generator=g), torch.randn(6, 2, generator=g)
    model.zero_grad()
    (SCALES[step] * nn.functional.mse_loss(model(x), y)).backward()
    if step == 2 and rank == 1:
        model[0].weight.grad[0, 0] = math.inf


def _optimizer(kind: str, model: nn.Module) -> torch.optim.Optimizer:
    if kind == "sgd":
        return torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    return torch.optim.AdamW(model.parameters(), lr=0.01)


def _rank(ctx, kind: str) -> dict:
    sync_model, post_model = _model(), _model()
    sync_opt, post_opt = _optimizer(kind, sync_model), _optimizer(kind, post_model)
    post = PostValidatedOptimizer(post_opt, post_model.parameters(), max_norm=MAX_NORM)
    actions, equal = [], []
    for step in range(len(SCALES)):
        _grads(sync_model, ctx.rank, step)
        expected = _by_hand(sync_model)  # the clipped or skipped gradients, written out
        done = synchronous_step(sync_opt, sync_model.parameters(), max_norm=MAX_NORM)
        _grads(post_model, ctx.rank, step)
        post.step()
        result = post.confirm()
        actions.append((done.action, result.action))
        equal.append(all(torch.equal(a, b) for a, b in
                         zip(sync_model.parameters(), post_model.parameters(), strict=True)))  # fmt: skip
        if expected is not None:
            got = [p.grad for p in sync_model.parameters()]
            assert all(torch.allclose(g, e, rtol=1e-12, atol=0) for g, e in zip(got, expected))
    return {"actions": actions, "equal": equal}


def _by_hand(model: nn.Module) -> list[torch.Tensor] | None:
    """Global-norm clipping over both ranks (None when a gradient is not finite)."""
    grads = [p.grad.detach().clone() for p in model.parameters()]
    local = torch.tensor([sum(float(g.double().pow(2).sum()) for g in grads),
                          float(sum(int((~g.isfinite()).sum()) for g in grads))],
                         dtype=torch.float64)  # fmt: skip
    dist.all_reduce(local)
    if local[1] > 0:
        return None
    norm = math.sqrt(float(local[0]))
    coef = MAX_NORM / (norm + 1e-6) if norm > MAX_NORM else 1.0
    return [g * coef for g in grads]


@pytest.mark.parametrize("kind", ["sgd", "adamw"])
def test_post_validation_equals_the_synchronous_step_bit_for_bit(kind: str) -> None:
    for res in spawn(_rank, 2, args=(kind,), timeout_s=120):
        assert res["actions"] == [("kept", "kept"), ("clipped", "clipped"),
                                  ("skipped", "skipped"), ("kept", "kept")]  # fmt: skip
        assert res["equal"] == [True] * len(SCALES)


def test_bad_settings_are_refused() -> None:
    opt = torch.optim.SGD(_model().parameters(), lr=0.1)
    with pytest.raises(ValueError, match="max_norm=0"):
        PostValidatedOptimizer(opt, [], max_norm=0)
    with pytest.raises(ValueError, match="max_norm=inf"):
        PostValidatedOptimizer(opt, [], max_norm=math.inf)


def test_the_runner_hook_example_equals_the_synchronous_step() -> None:
    """``examples/pp_post_validation.py``: ``PipelineRunner(hooks=[post])`` on 2 ranks, the
    loop calling only ``post.step()``, against the synchronous step in the same run."""
    example = Path(__file__).resolve().parents[3] / "examples" / "pp_post_validation.py"
    out = subprocess.run([sys.executable, str(example), "--steps", "6"], capture_output=True,
                         text=True, timeout=600)  # fmt: skip
    assert out.returncode == 0, out.stderr
    steps = re.findall(r"synchronous (\w+), post-validated (\w+), weights equal: (\w+)", out.stdout)
    assert len(steps) == 6, out.stdout
    assert all(sync == post and equal == "True" for sync, post, equal in steps), out.stdout
    assert {sync for sync, _, _ in steps} == {"kept", "clipped"}, out.stdout  # both paths ran
