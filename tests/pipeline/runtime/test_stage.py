"""B/W split and stage execution on one process, checked against plain autograd."""

from __future__ import annotations

import pytest
import torch

from nobubble.pipeline.runtime.bw_split import SplitLinear, WeightGradStore, attach_store
from nobubble.pipeline.runtime.memory import ActivationMeter
from nobubble.pipeline.runtime.models import (
    GPTConfig,
    MLPConfig,
    build_blocks,
    partition_blocks,
)
from nobubble.pipeline.runtime.stage import PipelineStage

TINY_GPT = GPTConfig(vocab_size=32, seq_len=8, hidden=16, num_heads=2, num_layers=4, seed=3)
TINY_MLP = MLPConfig(in_features=8, hidden=16, num_classes=5, num_layers=4, seed=4)


def reference_grads(config, batch, num_microbatches):
    """Plain autograd on the whole model, gradient accumulation over the microbatches."""
    blocks = build_blocks(config)
    for mb in batch.split(num_microbatches):
        y = mb.inputs
        for blk in blocks.values():
            y = blk(y)
        (config.loss(y, mb.targets) / num_microbatches).backward()
    return {n: p.grad.clone() for n, p in blocks.named_parameters()}


def run_stages(config, batch, num_stages, num_microbatches, order):
    """Run the stages in one process; ``order`` is "fused" or "deferred" (all B, then W)."""
    ranges = partition_blocks(config, num_stages)
    blocks = [build_blocks(config, r) for r in ranges]
    stages = [
        PipelineStage(
            stage_index=s,
            num_stages=num_stages,
            blocks=blocks[s],
            loss_fn=config.loss,
            num_microbatches=num_microbatches,
            meter=ActivationMeter(blocks[s]),  # saved-tensor hooks must not change gradients
        )
        for s in range(num_stages)
    ]
    mbs = batch.split(num_microbatches)
    for m, mb in enumerate(mbs):
        x = mb.inputs
        for st in stages:
            x = st.forward(m, x, mb.targets if st.is_last else None)
    for m in reversed(range(num_microbatches)):
        grad = None
        for st in reversed(stages):
            if order == "fused":
                grad = st.backward_full(m, grad)
            else:
                grad = st.backward_input(m, grad)
    if order == "deferred":
        for m in range(num_microbatches):
            for st in stages:
                st.backward_weight(m)
    grads = {}
    for b in blocks:
        grads.update({n: p.grad for n, p in b.named_parameters()})
    return grads, stages


@pytest.mark.parametrize("config", [TINY_GPT, TINY_MLP], ids=["gpt", "mlp"])
@pytest.mark.parametrize("order", ["fused", "deferred"])
def test_stage_gradients_equal_plain_autograd(config, order):
    batch = config.make_batch(8, seed=11)
    ref = reference_grads(config, batch, 4)
    got, stages = run_stages(config, batch, 3, 4, order)
    assert set(got) == set(ref)
    for name in ref:
        torch.testing.assert_close(got[name], ref[name], rtol=1e-5, atol=1e-7, msg=name)
    assert all(not st.store.pending_microbatches for st in stages)


def test_split_linear_defers_only_weight_gradient():
    torch.manual_seed(0)
    lin = SplitLinear(5, 3)
    x = torch.randn(4, 2, 5, requires_grad=True)  # (B, T, in)
    dy = torch.randn(4, 2, 3)
    store = WeightGradStore()
    attach_store(lin, store)
    with store.recording(7):
        y = lin(x)
    y.backward(dy)
    assert lin.weight.grad is None and lin.bias.grad is None  # B left dW, db for later
    torch.testing.assert_close(x.grad, dy @ lin.weight.detach())
    assert store.pending_microbatches == (7,)
    assert store.flush(7) == 1
    torch.testing.assert_close(lin.weight.grad, torch.einsum("bto,bti->oi", dy, x.detach()))
    torch.testing.assert_close(lin.bias.grad, dy.sum((0, 1)))
    with pytest.raises(RuntimeError, match="before its B"):
        store.flush(7)


def test_stage_rejects_out_of_order_ops():
    ranges = partition_blocks(TINY_MLP, 2)
    st = PipelineStage(
        stage_index=1,
        num_stages=2,
        blocks=build_blocks(TINY_MLP, ranges[1]),
        loss_fn=TINY_MLP.loss,
        num_microbatches=1,
    )
    with pytest.raises(RuntimeError, match="B of microbatch 0 before its F"):
        st.backward_input(0)
    with pytest.raises(RuntimeError, match="W of microbatch 0 before its B"):
        st.backward_weight(0)


def test_partition_balances_layers_and_rejects_too_many_stages():
    ranges = partition_blocks(TINY_GPT, 4)  # 6 blocks: emb, 4 layers, head
    assert [list(r) for r in ranges] == [[0, 1], [2], [3], [4, 5]]
    assert [list(r) for r in partition_blocks(TINY_GPT, 3)] == [[0, 1, 2], [3], [4, 5]]
    with pytest.raises(ValueError, match="4 layers but the schedule has 5 stages"):
        partition_blocks(TINY_GPT, 5)


def test_subset_blocks_equal_full_model_blocks():
    full = build_blocks(TINY_GPT)
    part = build_blocks(TINY_GPT, range(2, 4))
    for name, p in part.named_parameters():
        torch.testing.assert_close(p, dict(full.named_parameters())[name], rtol=0, atol=0)


def test_meter_holds_forward_then_stash_then_nothing():
    ranges = partition_blocks(TINY_GPT, 1)
    blocks = build_blocks(TINY_GPT, ranges[0])
    meter = ActivationMeter(blocks)
    st = PipelineStage(
        stage_index=0,
        num_stages=1,
        blocks=blocks,
        loss_fn=TINY_GPT.loss,
        num_microbatches=2,
        meter=meter,
    )
    batch = TINY_GPT.make_batch(4, seed=1).split(2)
    st.forward(0, batch[0].inputs, batch[0].targets)
    one = meter.live_bytes
    st.forward(1, batch[1].inputs, batch[1].targets)
    assert meter.live_bytes == 2 * one > 0
    st.backward_input(0)
    stash = meter.live_bytes - one
    assert 0 < stash < one  # W keeps (X, dY) of the linears only
    st.backward_weight(0)
    st.backward_full(1)
    assert meter.live_bytes == 0 and meter.peak_bytes == 2 * one


def test_device_and_clock_are_checked_options():
    from nobubble.pipeline.runtime.launch import LaunchOptions
    from nobubble.pipeline.runtime.profile import profile_stage

    assert LaunchOptions(device="cuda", backend="nccl").backend == "nccl"
    with pytest.raises(ValueError, match="device='tpu'"):
        LaunchOptions(device="tpu")
    with pytest.raises(ValueError, match="clock='cpu' measures CPU work"):
        profile_stage(TINY_MLP, range(0, 2), stage_index=0, num_stages=2, microbatch_size=2,
                      input_shape=None, output_shape=None, device="cuda", clock="cpu")  # fmt: skip
