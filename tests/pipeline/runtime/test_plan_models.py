"""The benchmark's and ``pp plan --model``'s three models (examples/plan_models.py) as blocks:
the Llama blocks compute what the Hugging Face model computes, the transformer's blocks are
causal, and a plan of the Llama runs on two ranks to the loss of the whole model."""

from __future__ import annotations

import importlib.util
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from torch import nn

from nobubble.distributed import spawn
from nobubble.pipeline import PipelineRunner, split_model
from nobubble.pipeline.plan import Plan
from nobubble.pipeline.runtime.planning import plan

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"
SMALL_LLAMA = {"layers": 2, "hidden": 64, "vocab": 500, "batch": 4, "seq": 16}


def _models():
    spec = importlib.util.spec_from_file_location("plan_models", EXAMPLES / "plan_models.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _chain(blocks, x: torch.Tensor) -> torch.Tensor:
    for block in blocks:
        x = block(x)
    return x


def test_llama_blocks_compute_the_hugging_face_models_logits() -> None:
    transformers = pytest.importorskip("transformers")
    blocks, ids, _, _ = _models().llama(**SMALL_LLAMA)
    config = transformers.LlamaConfig(
        vocab_size=500, hidden_size=64, intermediate_size=int(64 * 8 / 3) // 8 * 8,
        num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=8,
        max_position_embeddings=128, tie_word_embeddings=False,
    )  # fmt: skip
    torch.manual_seed(0)  # the factory's seed: the same weights, built by Hugging Face alone
    reference = transformers.LlamaForCausalLM(config).eval()
    with torch.no_grad():
        expected = reference(input_ids=ids).logits
        got = _chain(blocks, ids)
    assert got.shape == (4, 16, 500)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("factory", ["transformer", "llama"])
def test_token_t_never_sees_a_later_token(factory: str) -> None:
    if factory == "llama":
        pytest.importorskip("transformers")
        kwargs = SMALL_LLAMA
    else:
        kwargs = {"layers": 2, "hidden": 32, "vocab": 100, "batch": 2, "seq": 12}
    blocks, ids, _, _ = getattr(_models(), factory)(**kwargs)
    changed = ids.clone()
    changed[:, 7:] = (changed[:, 7:] + 1) % 100
    with torch.no_grad():
        a, b = _chain(blocks, ids), _chain(blocks, changed)
    torch.testing.assert_close(a[:, :7], b[:, :7])
    assert not torch.allclose(a[:, 7:], b[:, 7:])


def test_uneven_blocks_widen() -> None:
    blocks, x, y, _ = _models().uneven(widths=(8, 16, 64), batch=4)
    assert [b[0].out_features for b in blocks[:-1]] == [16, 64]
    assert _chain(blocks, x).shape == (4, 10) and y.shape == (4,)


def _run_plan(ctx, plan_json: str) -> float:
    blocks, ids, targets, loss_fn = _models().llama(**SMALL_LLAMA)
    p = Plan.from_json(plan_json)
    runner = PipelineRunner(split_model(blocks, p.num_stages, balance=p), p.schedule(), loss_fn,
                            recompute=p.recompute[0])  # fmt: skip
    loss = float(runner.step(ids, targets))
    runner.close()
    return loss


def test_a_plan_of_the_llama_runs_on_two_ranks_to_the_whole_models_loss() -> None:
    pytest.importorskip("transformers")
    torch.set_num_threads(1)
    blocks, ids, targets, loss_fn = _models().llama(**SMALL_LLAMA)
    p = plan(blocks, ids, targets, loss_fn, num_ranks=2, num_microbatches=2)
    losses = spawn(_run_plan, 2, args=(p.to_json(),), timeout_s=120)
    # the reference: the whole model in one process, per microbatch, mean of the two losses
    with torch.no_grad():
        whole = [loss_fn(_chain(blocks, i), t) for i, t in zip(ids.chunk(2), targets.chunk(2),
                                                                  strict=True)]  # fmt: skip
    expected = float(sum(whole) / 2)
    assert losses[0] == losses[1]
    assert losses[0] == pytest.approx(expected, rel=1e-5)
    assert isinstance(blocks[-1], nn.Linear)


def _peak(ctx, plan_json: str) -> int:
    p = Plan.from_json(plan_json)
    blocks, x, y, loss_fn = _models().uneven(widths=(64, 128, 256, 512, 1024, 1024), batch=256)
    runner = PipelineRunner(split_model(blocks, p.num_stages, balance=p), p.schedule(), loss_fn)
    runner.step(x, y)
    runner.close()
    return runner.peak_activation_bytes


@pytest.mark.parametrize("schedule", ["1f1b", "zb-h1", "zb-2p"])
def test_the_predicted_peak_is_the_runners_measured_peak(schedule: str) -> None:
    """Bytes, not times: the planner's peak per rank equals what the runner counts, for fused
    and for split backwards (W's store holds a microbatch until its W)."""
    blocks, x, y, loss_fn = _models().uneven(widths=(64, 128, 256, 512, 1024, 1024), batch=256)
    p = plan(blocks, x, y, loss_fn, num_ranks=2, num_microbatches=8, recompute=False)
    p = replace(p, chosen=p.weigh((4,), schedule))  # the last rank: two blocks, split B / W
    measured = spawn(_peak, 2, args=(p.to_json(),), timeout_s=120)
    assert measured == [int(b) for b in p.predicted_peak_bytes]
