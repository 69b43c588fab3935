"""The stage executor (ModuleSplit: F, B, W, BW) on the built-in models' stages in one
process, checked against plain autograd; the deferred linear; the models' split."""

from __future__ import annotations

from collections import OrderedDict

import pytest
import torch
from torch import nn

from nobubble.pipeline.runtime.autosplit import ModuleSplit
from nobubble.pipeline.runtime.bw_split import WeightGradStore, deferred_linear
from nobubble.pipeline.runtime.models import (
    GPTConfig,
    MLPConfig,
    build_blocks,
    partition_blocks,
)

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
    """Run the stages in one process through ModuleSplit, as the runner does (stage 0
    recorded unsplit, the loss scaled by ``1 / m``); ``order`` is "fused" (BW) or "deferred"
    (every B, then every W)."""
    ranges = partition_blocks(config, num_stages)
    blocks = [build_blocks(config, r) for r in ranges]
    splits = [ModuleSplit(nn.Sequential(OrderedDict(b.items()))) for b in blocks]
    mbs = batch.split(num_microbatches)
    held: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor | None]] = {}
    for m, mb in enumerate(mbs):
        x = mb.inputs
        for s, split in enumerate(splits):
            stage_in = None if s == 0 else x.detach().requires_grad_(True)
            with split.recording(m, split=s > 0 and order == "deferred"):
                y = split.module(x if stage_in is None else stage_in)
                if s == num_stages - 1:
                    y = config.loss(y, mb.targets) / num_microbatches
            held[s, m] = (y, stage_in)
            x = y.detach()
    for m in reversed(range(num_microbatches)):
        grad = None
        for s in reversed(range(num_stages)):
            y, stage_in = held.pop((s, m))
            run = splits[s].backward_full if order == "fused" else splits[s].backward_input
            grad = run(m, y, grad, stage_in)
    if order == "deferred":
        for m in range(num_microbatches):
            for split in splits:
                split.backward_weight(m)
    grads = {}
    for b in blocks:
        grads.update({n: p.grad for n, p in b.named_parameters()})
    return grads, splits


@pytest.mark.parametrize("config", [TINY_GPT, TINY_MLP], ids=["gpt", "mlp"])
@pytest.mark.parametrize("order", ["fused", "deferred"])
def test_stage_gradients_equal_plain_autograd(config, order):
    batch = config.make_batch(8, seed=11)
    ref = reference_grads(config, batch, 4)
    got, splits = run_stages(config, batch, 3, 4, order)
    assert set(got) == set(ref)
    for name in ref:
        torch.testing.assert_close(got[name], ref[name], rtol=1e-5, atol=1e-7, msg=name)
    assert all(not split.store.pending_microbatches for split in splits)


def test_deferred_linear_defers_only_weight_gradient():
    torch.manual_seed(0)
    lin = nn.Linear(5, 3)
    x = torch.randn(4, 2, 5, requires_grad=True)  # (B, T, in)
    dy = torch.randn(4, 2, 3)
    store = WeightGradStore()
    y = deferred_linear(x, lin.weight, lin.bias, store, 7)
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
    split = ModuleSplit(nn.Sequential(OrderedDict(build_blocks(TINY_MLP, ranges[1]).items())))
    y = torch.zeros(1, requires_grad=True)
    with pytest.raises(RuntimeError, match="B of microbatch 0 before its F"):
        split.backward_input(0, y, None, None)
    with pytest.raises(RuntimeError, match="W of microbatch 0 before its B"):
        split.backward_weight(0)


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


def test_device_and_clock_are_checked_options():
    from nobubble.pipeline.runtime.launch import LaunchOptions
    from nobubble.pipeline.runtime.profile import profile_stages

    assert LaunchOptions(device="cuda", backend="nccl").backend == "nccl"
    with pytest.raises(ValueError, match="device='tpu'"):
        LaunchOptions(device="tpu")
    for bad, words in ({"backend": "bogus"}, "backend='bogus' is unknown"), (
        {"timeout_s": float("nan")}, "timeout_s=nan must be > 0"), (
        {"threads_per_rank": 0}, "threads_per_rank=0 must be an integer >= 1"):  # fmt: skip
        with pytest.raises(ValueError, match=words):
            LaunchOptions(**bad)
    with pytest.raises(ValueError, match="clock='cpu' measures CPU work"):
        profile_stages(TINY_MLP, 2, microbatch_size=2, device="cuda", clock="cpu")


def test_profile_stages_adds_the_measured_transfer_and_restores_threads():
    from nobubble.pipeline.runtime.models import partition_blocks
    from nobubble.pipeline.runtime.profile import profile_stages

    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        prof = profile_stages(TINY_MLP, 2, microbatch_size=2, repeats=1, threads=1, comm=True,
                              timeout_s=60)  # fmt: skip
        assert torch.get_num_threads() == 2  # profiled with 1 thread, the count restored
    finally:
        torch.set_num_threads(before)
    ranges = partition_blocks(TINY_MLP, 2)
    assert [tuple(s.blocks) for s in prof.stages] == [tuple(r) for r in ranges]
    assert prof.model == TINY_MLP.name and prof.t_comm > 0  # one-way time between 2 ranks
    quiet = profile_stages(TINY_MLP, 2, microbatch_size=2, repeats=1)
    one = profile_stages(TINY_MLP, 1, microbatch_size=2, repeats=1, comm=True)  # no boundary
    assert (quiet.t_comm, one.t_comm, len(one.stages)) == (0.0, 0.0, 1)


@pytest.mark.parametrize("config", [TINY_GPT, TINY_MLP, GPTConfig(), MLPConfig(hidden=24)])
def test_a_configs_parameter_count_is_its_built_models(config) -> None:
    """``num_parameters`` (counted without torch, for the command line's budgets) equals the
    parameters of the blocks ``build_blocks`` builds."""
    built = sum(p.numel() for p in build_blocks(config).parameters())
    assert config.num_parameters == built
