"""Truncated IS and band masking at token, sequence and geometric level, by hand."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from nobubble.rl import (
    importance_log_ratio,
    mask_outside_band,
    off_policy_correction,
    ppo_policy_loss,
    truncated_importance_weights,
)

# Two responses of three tokens; the second has two valid tokens. Per-token ratios pi/mu:
RHO = torch.tensor([[0.5, 4.0, 1.5], [3.0, 1.0, 7.0]], dtype=torch.float64)
MASK = torch.tensor([[1, 1, 1], [1, 1, 0]], dtype=torch.float64)
BEHAV = torch.full((2, 3), -2.0, dtype=torch.float64)
LOGP = BEHAV + RHO.log()


def test_token_level_truncation_by_hand() -> None:
    w = truncated_importance_weights(LOGP, BEHAV, MASK, level="token", cap=2.0)
    assert w.flatten().tolist() == pytest.approx([0.5, 2.0, 1.5, 2.0, 1.0, 0.0])


def test_sequence_and_geometric_levels_by_hand() -> None:
    seq = truncated_importance_weights(LOGP, BEHAV, MASK, level="sequence", cap=10.0)
    # sequence 0: 0.5 * 4 * 1.5 = 3; sequence 1: 3 * 1 = 3 (masked token ignored)
    assert seq.flatten().tolist() == pytest.approx([3.0, 3.0, 3.0, 3.0, 3.0, 0.0])
    geo = importance_log_ratio(LOGP, BEHAV, MASK, level="geometric").exp()
    assert geo[0].tolist() == pytest.approx([3 ** (1 / 3)] * 3)
    assert geo[1, 0].item() == pytest.approx(math.sqrt(3))


def test_band_masking_token_and_sequence() -> None:
    tok = mask_outside_band(LOGP, BEHAV, MASK, level="token", low=0.6, high=2.0)
    assert tok.flatten().tolist() == [0.0, 0.0, 1.0, 0.0, 1.0, 0.0]
    seq = mask_outside_band(LOGP, BEHAV, MASK, level="geometric", low=0.5, high=1.6)
    # geometric means: 3^(1/3) = 1.442 (kept), sqrt(3) = 1.732 (dropped)
    assert seq.flatten().tolist() == [1.0, 1.0, 1.0, 0.0, 0.0, 0.0]


def test_combined_correction_and_use_in_loss() -> None:
    c = off_policy_correction(LOGP, BEHAV, MASK, level="token", cap=2.0, band=(0.6, 5.0))
    assert c.mask.flatten().tolist() == [0.0, 1.0, 1.0, 1.0, 1.0, 0.0]
    assert c.weights.flatten().tolist() == pytest.approx([0.0, 2.0, 1.5, 2.0, 1.0, 0.0])
    assert c.masked_fraction.item() == pytest.approx(1 / 5)
    assert c.truncated_fraction.item() == pytest.approx(2 / 5)
    # weights scale each token's loss: ratio 1 (logp == old) so per-token loss is -A = 1
    logp = torch.zeros(2, 3, dtype=torch.float64)
    out = ppo_policy_loss(logp, logp, -torch.ones(2), c.mask, weights=c.weights)
    assert out.loss.item() == pytest.approx((2.0 + 1.5 + 2.0 + 1.0) / 4)


def test_weights_are_detached() -> None:
    logp = LOGP.clone().requires_grad_()
    assert not truncated_importance_weights(logp, BEHAV, MASK).requires_grad


@settings(max_examples=60, deadline=None)
@given(
    st.integers(0, 2**31 - 1),
    st.floats(1.0, 5.0),
    st.sampled_from(["token", "sequence", "geometric"]),
)
def test_weights_bounded_and_equal_rho_below_cap(seed, cap, level) -> None:
    g = torch.Generator().manual_seed(seed)
    behav = torch.randn(3, 4, generator=g, dtype=torch.float64)
    logp = behav + 0.7 * torch.randn(3, 4, generator=g, dtype=torch.float64)
    mask = (torch.rand(3, 4, generator=g) > 0.3).to(torch.float64)
    w = truncated_importance_weights(logp, behav, mask, level=level, cap=cap)
    rho = importance_log_ratio(logp, behav, mask, level).exp()
    assert torch.all(w <= cap) and torch.all(w >= 0)
    below = (rho < cap) & (mask > 0)
    torch.testing.assert_close(w[below], rho[below])
    assert torch.all(w[mask == 0] == 0)


def test_on_policy_changes_nothing() -> None:
    c = off_policy_correction(BEHAV, BEHAV, MASK, level="sequence", cap=2.0, band=(0.5, 2.0))
    torch.testing.assert_close(c.weights, MASK)
    torch.testing.assert_close(c.mask, MASK)


def test_bad_input() -> None:
    with pytest.raises(ValueError, match="cap=0"):
        truncated_importance_weights(LOGP, BEHAV, MASK, cap=0)
    with pytest.raises(ValueError, match="low=1.5"):
        mask_outside_band(LOGP, BEHAV, MASK, low=1.5, high=2.0)
    with pytest.raises(ValueError, match="level='seq'"):
        importance_log_ratio(LOGP, BEHAV, MASK, level="seq")
    with pytest.raises(ValueError, match=r"\(B, T\)"):
        importance_log_ratio(LOGP, BEHAV[:1], MASK)
