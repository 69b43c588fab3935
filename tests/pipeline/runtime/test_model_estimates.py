"""The built-in models' size and time estimates (:mod:`nobubble.pipeline.runtime.models`),
which the command line's budgets refuse runs by before any work: checked against the models
built with torch and against sums worked by hand."""

from __future__ import annotations

import pytest

from nobubble.pipeline.runtime.models import (
    GPTConfig,
    MLPConfig,
    build_blocks,
    memory_bytes,
    profile_seconds,
    train_seconds,
)

GPT = GPTConfig(vocab_size=32, seq_len=8, hidden=16, num_heads=2, num_layers=3)
MLP = MLPConfig(hidden=24, num_layers=2)


@pytest.mark.parametrize(
    ("model", "per_token"),
    [(GPT, 40 * 16 * 3 + 3 * 32), (MLP, 10 * 24 * 2)],  # per token: 40 h L + 3 V; 10 h L
)
def test_memory_is_the_weights_state_and_the_activations_in_flight(model, per_token) -> None:
    params = sum(p.numel() for p in build_blocks(model).parameters())  # built, not counted
    tokens = 4 * model.tokens_per_sample  # microbatches of 4 samples
    for ranks in (1, 3):
        expected = 16.0 * params + ranks * tokens * per_token * 4  # fp32 activations
        assert memory_bytes(model, microbatch_size=4, num_ranks=ranks) == expected


def test_the_time_estimates_are_the_documented_sums() -> None:
    # 1e6 parameters x 100 tokens x 6 FLOPs at 1 GFLOP/s: 0.6 s a microbatch's compute
    assert train_seconds(10**6, 100, num_ranks=2, num_microbatches=4, steps=3) == pytest.approx(
        3 * 4 * (0.6 + 3 * 2 * 1e-3)
    )
    assert profile_seconds(10**6, 100, repeats=5) == pytest.approx((5 + 1) * (2 * 0.6 + 4e-3))
    # a model without parameters still pays the runtime's own cost per action
    assert train_seconds(0, 100, num_ranks=1, num_microbatches=1, steps=1) == pytest.approx(3e-3)


@pytest.mark.parametrize(
    ("call", "needle"),
    [
        (lambda: train_seconds(10, 10, num_ranks=1, num_microbatches=1, steps=0), "steps=0"),
        (lambda: train_seconds(10, -1, num_ranks=1, num_microbatches=1, steps=1), "tokens=-1"),
        (lambda: profile_seconds(10, 10, repeats=0), "repeats=0"),
        (lambda: memory_bytes(GPT, microbatch_size=0, num_ranks=1), "microbatch_size=0"),
        (lambda: memory_bytes(GPT, microbatch_size=1, num_ranks=1.5), "num_ranks=1.5"),
    ],
)
def test_a_size_out_of_range_is_refused(call, needle: str) -> None:
    with pytest.raises(ValueError, match=needle):
        call()


def test_a_user_models_size_as_the_estimates_count_it() -> None:
    import torch
    from torch import nn

    from nobubble.pipeline.runtime.planning import UserModel

    blocks = [nn.Linear(4, 3), nn.Linear(3, 2)]  # (4 + 1) x 3 + (3 + 1) x 2 parameters
    rows = UserModel(blocks, torch.zeros(5, 4), torch.zeros(5, 2), nn.functional.mse_loss)
    assert (rows.num_parameters, rows.batch_tokens) == (23, 5)  # features: a row each
    ids = torch.zeros(5, 7, dtype=torch.int64)  # token ids (B, T): B x T tokens
    tokens = UserModel([nn.Embedding(8, 3)], ids, ids, nn.functional.mse_loss)
    assert (tokens.num_parameters, tokens.batch_tokens) == (24, 35)


@pytest.mark.parametrize(
    ("device", "local"), [("cpu", "cpu"), ("cuda", "cuda:0"), ("cuda:1", "cuda:1")]
)
def test_the_launching_process_uses_the_first_gpu(device: str, local: str) -> None:
    from nobubble.distributed.options import LaunchOptions

    assert LaunchOptions(device=device).local_device == local
