"""The policy: causal, sampling log-probs equal a fresh forward pass, budgets and EOS."""

from __future__ import annotations

import pytest
import torch

from nobubble.rl.system.policies import (
    CharTransformer,
    PolicyConfig,
    response_logits,
    sample,
)
from tests.rl.system.trainer_reference import response_logprobs


def _model(seed: int = 0, vocab: int = 9, max_len: int = 12) -> CharTransformer:
    torch.manual_seed(seed)
    return CharTransformer(PolicyConfig(vocab_size=vocab, max_seq_len=max_len, hidden=32))


def test_causal_later_tokens_do_not_change_earlier_logits():
    model = _model()
    x = torch.randint(3, 9, (4, 10))
    y = x.clone()
    y[:, 6:] = torch.randint(3, 9, (4, 4))
    lx, vx = model(x)
    ly, vy = model(y)
    torch.testing.assert_close(lx[:, :6], ly[:, :6])
    torch.testing.assert_close(vx[:, :6], vy[:, :6])


def test_sampled_logprobs_equal_a_fresh_forward_pass():
    """The incremental sampler's log-probs against one full forward over the result."""
    model = _model(1)
    prompts = torch.randint(3, 9, (16, 5))
    g = torch.Generator().manual_seed(0)
    gen = sample(model, prompts, max_new_tokens=6, eos_id=2, pad_id=0, generator=g)
    ref = response_logprobs(model, gen.tokens, prompt_len=5)
    m = gen.response_mask
    torch.testing.assert_close(gen.logprobs[m], ref[m], rtol=1e-5, atol=1e-5)
    assert (gen.logprobs[~m] == 0).all()


def test_temperature_logprobs_match():
    model = _model(2)
    prompts = torch.randint(3, 9, (8, 5))
    gen = sample(model, prompts, max_new_tokens=4, eos_id=2, pad_id=0, temperature=0.7)
    ref = response_logprobs(model, gen.tokens, 5, temperature=0.7)
    m = gen.response_mask
    torch.testing.assert_close(gen.logprobs[m], ref[m], rtol=1e-5, atol=1e-5)


def test_eos_and_budgets_end_sequences():
    model = _model(3)
    with torch.no_grad():  # make <eos> (id 2) certain after the first token
        model.lm_head.bias.zero_()
        model.lm_head.bias[2] = 50.0
    prompts = torch.randint(3, 9, (3, 5))
    gen = sample(model, prompts, max_new_tokens=5, eos_id=2, pad_id=0)
    assert gen.tokens.shape == (3, 10)
    assert gen.response_mask.tolist() == [[True, False, False, False, False]] * 3
    assert (gen.tokens[:, 6:] == 0).all()
    with torch.no_grad():
        model.lm_head.bias[2] = -50.0
    budgets = torch.tensor([1, 3, 0])
    gen = sample(model, prompts, max_new_tokens=5, eos_id=2, pad_id=0, budgets=budgets)
    assert gen.response_mask.sum(1).tolist() == [1, 3, 0]


def test_greedy_is_argmax_of_logits():
    model = _model(4)
    prompts = torch.randint(3, 9, (6, 5))
    gen = sample(model, prompts, max_new_tokens=3, eos_id=2, pad_id=0, greedy=True)
    logits, _ = response_logits(model, gen.tokens, 5)
    m = gen.response_mask
    assert torch.equal(logits.argmax(-1)[m], gen.tokens[:, 5:][m])


def test_config_validation_names_the_value():
    with pytest.raises(ValueError, match="num_heads=3"):
        PolicyConfig(vocab_size=5, max_seq_len=8, hidden=32, num_heads=3)
    with pytest.raises(ValueError, match="vocab_size=0"):
        PolicyConfig(vocab_size=0, max_seq_len=8)
    model = _model()
    with pytest.raises(ValueError, match="max_seq_len=12"):
        model(torch.zeros(1, 13, dtype=torch.long))
