"""PPO / decoupled PPO / PG / KL losses: gradients, caps, hand-checked aggregation, splits."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from nobubble.rl.algo.losses import (
    LOSS_AGG_MODES,
    aggregate_loss,
    kl_penalty,
    policy_entropy,
    policy_gradient_loss,
    ppo_policy_loss,
)


def _ratios_grid() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    ratios = torch.tensor([0.5, 0.7, 0.85, 1.0, 1.1, 1.3, 1.6], dtype=torch.float64)
    ratio = torch.cat([ratios, ratios]).reshape(2, 7)  # (B=2, T=7)
    adv = torch.tensor([[1.5] * 7, [-2.0] * 7], dtype=torch.float64)
    old_logp = torch.full_like(ratio, -1.0)
    return ratio, adv, old_logp


def test_zero_gradient_exactly_where_clipped_branch_is_active() -> None:
    ratio, adv, old_logp = _ratios_grid()
    logp = (old_logp + ratio.log()).requires_grad_()
    mask = torch.ones_like(ratio)
    out = ppo_policy_loss(logp, old_logp, adv, mask, clip_low=0.2, clip_high=0.2)
    out.loss.backward()
    # By hand: A > 0 is clipped where r > 1.2, A < 0 where r < 0.8.
    clipped = ((adv > 0) & (ratio > 1.2)) | ((adv < 0) & (ratio < 0.8))
    assert clipped.sum().item() == 4
    assert torch.all(logp.grad[clipped] == 0.0)
    # Elsewhere d/dlogp of mean(-A r) = -A r / N, non-zero.
    expected = -adv * ratio / ratio.numel()
    torch.testing.assert_close(logp.grad[~clipped], expected[~clipped])
    assert torch.all(logp.grad[~clipped] != 0.0)
    assert out.clip_fraction.item() == pytest.approx(4 / 14)


def test_asymmetric_clip_bounds() -> None:
    ratio, adv, old_logp = _ratios_grid()
    logp = (old_logp + ratio.log()).requires_grad_()
    out = ppo_policy_loss(logp, old_logp, adv, torch.ones_like(ratio), clip_low=0.2, clip_high=0.5)
    out.loss.backward()
    clipped = ((adv > 0) & (ratio > 1.5)) | ((adv < 0) & (ratio < 0.8))
    assert torch.all(logp.grad[clipped] == 0.0) and torch.all(logp.grad[~clipped] != 0.0)


def test_dual_clip_caps_negative_advantage_loss() -> None:
    # A = -2, r = 10: plain PPO loss = max(20, 2 * 1.2) = 20; dual clip c = 3 caps at 3 * 2 = 6.
    old_logp = torch.zeros(1, 3, dtype=torch.float64)
    ratio = torch.tensor([[10.0, 2.0, 10.0]], dtype=torch.float64)
    adv = torch.tensor([[-2.0, -2.0, 2.0]], dtype=torch.float64)
    logp = ratio.log().requires_grad_()
    mask = torch.ones_like(ratio)
    out = ppo_policy_loss(
        logp, old_logp, adv, mask, 0.2, 0.2, dual_clip=3.0, agg="seq-mean-token-sum"
    )
    # token 0: capped at 6 (zero grad); token 1: -A r = 4 < 6 (grad -A r = 4);
    # token 2: A > 0, r > 1.2 so clipped: -2 * 1.2 = -2.4 (zero grad).
    assert out.loss.item() == pytest.approx(6.0 + 4.0 - 2.4)
    out.loss.backward()
    assert logp.grad[0].tolist() == pytest.approx([0.0, 4.0, 0.0])
    assert out.dual_clip_fraction.item() == pytest.approx(1 / 3)
    no_dual = ppo_policy_loss(logp, old_logp, adv, mask, 0.2, 0.2, agg="seq-mean-token-sum")
    assert no_dual.loss.item() == pytest.approx(20.0 + 4.0 - 2.4)


def _single_token_loss(r: float, a: float, lo: float, hi: float, c: float | None) -> float:
    logp = torch.tensor([[math.log(r)]], dtype=torch.float64)
    out = ppo_policy_loss(
        logp,
        torch.zeros_like(logp),
        torch.tensor([a], dtype=torch.float64),
        torch.ones_like(logp),
        lo,
        hi,
        c,
    )
    return out.loss.item()


@settings(max_examples=100, deadline=None)
@given(
    st.floats(0.05, 20.0),
    st.floats(-5.0, 5.0),
    st.floats(0.0, 0.5),
    st.floats(0.0, 0.5),
    st.one_of(st.none(), st.floats(1.01, 10.0)),
)
def test_ppo_token_loss_properties(r, a, lo, hi, c) -> None:
    loss = _single_token_loss(r, a, lo, hi, c)
    expect = max(-a * r, -a * min(max(r, 1 - lo), 1 + hi))
    if c is not None and a < 0:
        expect = min(expect, c * abs(a))
        assert loss <= c * abs(a) + 1e-12
    else:
        assert loss >= -a * r - 1e-9  # pessimistic bound: never better than unclipped
    assert loss == pytest.approx(expect, rel=1e-9, abs=1e-12)


# A hand example for the four aggregation modes. With ratio = 1 the PPO per-token loss is -A,
# so A = -L makes the loss matrix L.
L = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]], dtype=torch.float64)
M = torch.tensor([[1, 1, 0], [1, 0, 0]], dtype=torch.float64)
HAND = {
    "token-mean": (1 + 2 + 4) / 3,
    "seq-mean-token-mean": ((1 + 2) / 2 + 4 / 1) / 2,
    "seq-mean-token-sum": ((1 + 2) + 4) / 2,
    "seq-mean-token-sum-norm": ((1 + 2) / 3 + 4 / 3) / 2,
}


@pytest.mark.parametrize("agg", LOSS_AGG_MODES)
def test_aggregation_modes_by_hand(agg: str) -> None:
    assert aggregate_loss(L, M, agg).item() == pytest.approx(HAND[agg])
    logp = torch.zeros_like(L)
    out = ppo_policy_loss(logp, logp, -L, M, agg=agg)
    assert out.loss.item() == pytest.approx(HAND[agg])
    assert policy_gradient_loss(logp - 1.0, -L, M, agg=agg).item() == pytest.approx(-HAND[agg])


def test_sequence_with_no_tokens_is_not_counted() -> None:
    mask = torch.tensor([[1, 1, 0], [0, 0, 0]], dtype=torch.float64)
    assert aggregate_loss(L, mask, "seq-mean-token-sum").item() == pytest.approx(3.0)
    assert aggregate_loss(L, mask, "seq-mean-token-sum", global_num_seqs=2).item() == pytest.approx(
        1.5
    )
    assert aggregate_loss(L, torch.zeros_like(mask)).item() == 0.0
    assert aggregate_loss(L, M, "seq-mean-token-sum-norm", norm_length=6).item() == pytest.approx(
        7 / 12
    )


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 2**31 - 1), st.lists(st.integers(1, 4), min_size=1, max_size=6))
def test_token_mean_is_invariant_to_micro_batch_split(seed, sizes) -> None:
    g = torch.Generator().manual_seed(seed)
    B, T = sum(sizes), 5
    base = torch.randn(B, T, generator=g, dtype=torch.float64)
    old_logp = base - 0.3 * torch.randn(B, T, generator=g, dtype=torch.float64)
    adv = torch.randn(B, generator=g, dtype=torch.float64)
    mask = (torch.rand(B, T, generator=g) > 0.3).to(torch.float64)
    full_logp = base.clone().requires_grad_()
    full = ppo_policy_loss(full_logp, old_logp, adv, mask, 0.2, 0.28, dual_clip=3.0)
    full.loss.backward()
    split_logp = base.clone().requires_grad_()
    total, start = torch.zeros((), dtype=torch.float64), 0
    num_tokens = mask.sum()
    for n in sizes:  # gradient accumulation over micro-batches
        sl = slice(start, start + n)
        out = ppo_policy_loss(
            split_logp[sl],
            old_logp[sl],
            adv[sl],
            mask[sl],
            0.2,
            0.28,
            dual_clip=3.0,
            global_num_tokens=num_tokens,
        )
        out.loss.backward()
        total += out.loss.detach()
        start += n
    torch.testing.assert_close(total, full.loss.detach())
    torch.testing.assert_close(split_logp.grad, full_logp.grad)


def test_local_normalisation_is_not_split_invariant() -> None:
    # The reason for global_num_tokens: averaging per-micro-batch token means is biased.
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]], dtype=torch.float64)
    full = aggregate_loss(L, mask).item()
    per_micro = (aggregate_loss(L[:1], mask[:1]) + aggregate_loss(L[1:], mask[1:])).item() / 2
    assert full == pytest.approx(10 / 4) and per_micro == pytest.approx(3.0)


def test_weights_multiply_per_token_loss() -> None:
    logp = torch.zeros(2, 3, dtype=torch.float64)
    w = torch.tensor([0.5, 2.0], dtype=torch.float64)
    out = ppo_policy_loss(logp, logp, -L, M, agg="seq-mean-token-sum", weights=w)
    assert out.loss.item() == pytest.approx((0.5 * 3 + 2.0 * 4) / 2)


def test_decoupled_equals_ppo_when_proximal_is_behaviour() -> None:
    g = torch.Generator().manual_seed(0)
    logp = torch.randn(3, 4, generator=g, dtype=torch.float64).requires_grad_()
    old = logp.detach() + 0.2 * torch.randn(3, 4, generator=g, dtype=torch.float64)
    adv = torch.randn(3, generator=g, dtype=torch.float64)
    mask = torch.ones(3, 4, dtype=torch.float64)
    a = ppo_policy_loss(logp, old, adv, mask, 0.2, 0.3, 2.5)
    b = ppo_policy_loss(logp, old, adv, mask, 0.2, 0.3, 2.5, behav_logp=old)
    torch.testing.assert_close(a.loss, b.loss)
    assert b.behav_weight_mean.item() == pytest.approx(1.0)


def test_decoupled_weight_truncation_and_masking() -> None:
    # One token per sequence, ratio pi/pi_prox = 1 so the clipped surrogate is -A = 1.
    logp = torch.zeros(3, 1, dtype=torch.float64)
    prox = torch.zeros(3, 1, dtype=torch.float64)
    w = torch.tensor([[0.5], [2.0], [8.0]], dtype=torch.float64)  # pi_prox / pi_behav
    behav = prox - w.log()
    adv = torch.full((3,), -1.0, dtype=torch.float64)
    mask = torch.ones(3, 1, dtype=torch.float64)
    trunc = ppo_policy_loss(
        logp, prox, adv, mask, agg="seq-mean-token-sum", behav_logp=behav, behav_weight_cap=4.0
    )
    assert trunc.loss.item() == pytest.approx((0.5 + 2.0 + 4.0) / 3)
    masked = ppo_policy_loss(
        logp,
        prox,
        adv,
        mask,
        agg="seq-mean-token-sum",
        behav_logp=behav,
        behav_weight_cap=4.0,
        behav_weight_mode="mask",
    )
    assert masked.loss.item() == pytest.approx((0.5 + 2.0) / 2)
    uncapped = ppo_policy_loss(
        logp, prox, adv, mask, agg="seq-mean-token-sum", behav_logp=behav, behav_weight_cap=None
    )
    assert uncapped.loss.item() == pytest.approx((0.5 + 2.0 + 8.0) / 3)


def test_policy_gradient_loss_gradient() -> None:
    logp = torch.zeros(2, 3, dtype=torch.float64, requires_grad=True)
    adv = torch.tensor([[1.0, -2.0, 3.0], [0.5, 0.5, 0.5]], dtype=torch.float64)
    policy_gradient_loss(logp, adv, M).backward()
    assert logp.grad.flatten().tolist() == pytest.approx([-1 / 3, 2 / 3, 0.0, -0.5 / 3, 0.0, 0.0])


def test_kl_estimators_by_hand_and_monte_carlo() -> None:
    logp = torch.tensor([math.log(0.5)])
    ref = torch.tensor([math.log(0.25)])
    # log_r = log(0.25 / 0.5) = -log 2
    assert kl_penalty(logp, ref, "k1").item() == pytest.approx(math.log(2))
    assert kl_penalty(logp, ref, "k2").item() == pytest.approx(0.5 * math.log(2) ** 2)
    assert kl_penalty(logp, ref, "k3").item() == pytest.approx(0.5 - 1 + math.log(2))
    # k1 and k3 are unbiased for KL(pi || ref) under samples of pi.
    pi = torch.tensor([0.5, 0.3, 0.2], dtype=torch.float64)
    rf = torch.tensor([0.2, 0.3, 0.5], dtype=torch.float64)
    true_kl = (pi * (pi / rf).log()).sum().item()
    g = torch.Generator().manual_seed(0)
    a = torch.multinomial(pi, 200_000, replacement=True, generator=g)
    for kind in ("k1", "k3"):
        est = kl_penalty(pi.log()[a], rf.log()[a], kind).mean().item()
        assert est == pytest.approx(true_kl, abs=0.01)


@settings(max_examples=60, deadline=None)
@given(st.floats(-8, 0), st.floats(-8, 0))
def test_k2_k3_non_negative_and_zero_at_equality(lp, rp) -> None:
    a, b = torch.tensor([lp], dtype=torch.float64), torch.tensor([rp], dtype=torch.float64)
    assert kl_penalty(a, b, "k3").item() >= 0 and kl_penalty(a, b, "k2").item() >= 0
    assert kl_penalty(a, a, "k3").item() == 0.0


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**31 - 1), st.sampled_from(LOSS_AGG_MODES))
def test_stats_ranges_and_ratio_one_loss(seed, agg) -> None:
    g = torch.Generator().manual_seed(seed)
    logp = torch.randn(4, 5, generator=g, dtype=torch.float64)
    old = logp + 0.5 * torch.randn(4, 5, generator=g, dtype=torch.float64)
    adv = torch.randn(4, 5, generator=g, dtype=torch.float64)
    mask = (torch.rand(4, 5, generator=g) > 0.2).to(torch.float64)
    out = ppo_policy_loss(logp, old, adv, mask, agg=agg)
    assert 0.0 <= out.clip_fraction.item() <= 1.0 and out.approx_kl.item() >= 0.0
    on_policy = ppo_policy_loss(logp, logp, adv, mask, agg=agg)
    assert on_policy.clip_fraction.item() == 0.0 and on_policy.approx_kl.item() == 0.0
    assert on_policy.loss.item() == pytest.approx(aggregate_loss(-adv, mask, agg).item())


def test_bad_input_names_the_value() -> None:
    x = torch.zeros(2, 3)
    with pytest.raises(ValueError, match="clip_low=1.2"):
        ppo_policy_loss(x, x, x, x, clip_low=1.2)
    with pytest.raises(ValueError, match="dual_clip=0.5"):
        ppo_policy_loss(x, x, x, x, dual_clip=0.5)
    with pytest.raises(ValueError, match="agg='mean'"):
        ppo_policy_loss(x, x, x, x, agg="mean")
    with pytest.raises(ValueError, match=r"advantages has shape \(3,\)"):
        ppo_policy_loss(x, x, torch.zeros(3), x)
    with pytest.raises(ValueError, match="kind='k4'"):
        kl_penalty(x, x, "k4")
    with pytest.raises(ValueError, match="behav_weight_cap=0"):
        ppo_policy_loss(x, x, x, x, behav_logp=x, behav_weight_cap=0)


@given(st.integers(0, 2**31 - 1), st.integers(1, 7), st.floats(0.1, 30.0))
def test_policy_entropy_is_the_categoricals_by_its_definition(seed, actions, scale) -> None:
    """Against a loop over the definition -sum p log p (and torch's Categorical), for
    peaked and flat logits alike; uniform over A is log A."""
    g = torch.Generator().manual_seed(seed)
    logits = scale * torch.randn(3, 4, actions, generator=g, dtype=torch.float64)
    got = policy_entropy(torch.log_softmax(logits, -1))  # (3, 4)
    for i in range(3):
        for j in range(4):
            p = [math.exp(x) for x in logits[i, j].tolist()]
            z = sum(p)
            want = -sum(q / z * math.log(q / z) for q in p if q > 0)
            assert got[i, j].item() == pytest.approx(want, abs=1e-9)
    cat = torch.distributions.Categorical(logits=logits).entropy()
    assert torch.allclose(got, cat, atol=1e-9)
    flat = policy_entropy(torch.log_softmax(torch.zeros(actions, dtype=torch.float64), -1))
    assert flat.item() == pytest.approx(math.log(actions))
