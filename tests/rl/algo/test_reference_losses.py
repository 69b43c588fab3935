"""The toolbox's losses, advantages, V-trace and weights against `tests/rl/algo/reference.py`.

The reference writes each formula one element at a time and shares no code with the
package; here both run on hand-chosen float64 tensors (clipping on both sides, negative and
zero advantages, a zero-variance group, rho above and below rho-bar, an episode end) and on
hypothesis' random ones, and must agree on the value and on the gradient with respect to
the log-probs, to 1e-12. The reference itself is first checked against hand arithmetic.
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from nobubble.rl.algo.losses import (
    LOSS_AGG_MODES,
    aggregate_loss,
    grpo_advantages,
    kl_penalty,
    policy_gradient_loss,
    ppo_policy_loss,
)
from nobubble.rl.algo.staleness import staleness_weight
from nobubble.rl.algo.vtrace import vtrace
from tests.rl.algo.reference import (
    aggregate_ref,
    decoupled_ppo_loss_ref,
    grpo_advantages_ref,
    kl_ref,
    policy_gradient_loss_ref,
    ppo_clip_loss_ref,
    staleness_weight_ref,
    vtrace_ref,
)

F64 = torch.float64
TOL = {"rtol": 1e-12, "atol": 1e-12}  # float64 throughout: only summation order differs

# ---------------------------------------------------------------- hand-chosen batch (B=3, T=7)
RATIOS = [0.5, 0.7, 0.85, 1.0, 1.15, 1.3, 1.6]
ADV = torch.tensor(
    [
        [1.5] * 7,  # positive: clipped above 1 + clip_high
        [-2.0] * 7,  # negative: clipped below 1 - clip_low, dual-clipped at r = 1.6
        [-1.0, 0.7, 0.0, 2.5, -1.2, 0.9, -3.0],  # mixed, one zero
    ],
    dtype=F64,
)
MASK = torch.tensor(
    [[1, 1, 1, 1, 1, 1, 1], [0, 1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 0, 0]], dtype=F64
)
OLD_LOGP = -0.3 - 0.2 * torch.arange(7, dtype=F64) - 0.5 * torch.arange(3, dtype=F64)[:, None]
LOGP = OLD_LOGP + torch.tensor(RATIOS, dtype=F64).log()  # (3, 7): ratio = RATIOS per row
# log(pi_prox / pi_behav): weights e^-1 .. e^2 (above the cap 5 at 2.0)
PROX_MINUS_BEHAV = torch.tensor([-1.0, 0.0, 0.5, 1.2, 2.0, -0.4, 1.7], dtype=F64).expand(3, 7)
CLIP_LOW, CLIP_HIGH = 0.2, 0.28


def _value_and_grad(fn, logp: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``fn(x)`` at ``x = logp`` and its gradient with respect to ``x``."""
    x = logp.detach().clone().requires_grad_()
    out = fn(x)
    (grad,) = torch.autograd.grad(out, x)
    return out.detach(), grad


def _assert_same(package_fn, reference_fn, logp: torch.Tensor) -> None:
    value, grad = _value_and_grad(package_fn, logp)
    value_ref, grad_ref = _value_and_grad(reference_fn, logp)
    torch.testing.assert_close(value, value_ref, **TOL)
    torch.testing.assert_close(grad, grad_ref, **TOL)


def test_the_batch_exercises_every_branch() -> None:
    ratio = torch.tensor(RATIOS, dtype=F64).expand(3, 7)
    valid = MASK > 0
    assert ((ADV > 0) & (ratio > 1 + CLIP_HIGH) & valid).any()  # clipped above
    assert ((ADV < 0) & (ratio < 1 - CLIP_LOW) & valid).any()  # clipped below
    assert ((ADV < 0) & (ratio > 1 + CLIP_HIGH) & valid).any()  # unclipped, A < 0, r > 1
    assert ((ADV == 0) & valid).any()
    assert (PROX_MINUS_BEHAV.exp() > 5.0).any() and (PROX_MINUS_BEHAV.exp() < 1.0).any()


def _one_token(ratio: float, adv: float, dual_clip: float | None = None) -> tuple[float, float]:
    """The reference PPO loss of one token (clip 0.2) and its derivative in ``logp``."""
    logp = torch.tensor([[math.log(ratio)]], dtype=F64)
    advantages, mask = torch.tensor([adv], dtype=F64), torch.ones(1, 1, dtype=F64)
    value, grad = _value_and_grad(
        lambda x: ppo_clip_loss_ref(x, 0 * logp, advantages, mask, 0.2, 0.2, dual_clip), logp
    )
    return value.item(), grad.item()


def test_reference_ppo_token_by_hand() -> None:
    # one token each: (r, A) -> loss, d loss / d logp (= d/dlogp of -A r = -A r where unclipped)
    cases = [
        (1.6, 1.5, -1.5 * 1.2, 0.0),  # A > 0 above 1 + eps: constant
        (0.5, -2.0, 2.0 * 0.8, 0.0),  # A < 0 below 1 - eps: constant
        (0.85, 1.5, -1.5 * 0.85, -1.5 * 0.85),  # inside: -A r
        (0.5, 1.5, -1.5 * 0.5, -1.5 * 0.5),  # A > 0 below: the unclipped branch is lower
        (1.6, -2.0, 2.0 * 1.6, 2.0 * 1.6),  # A < 0 above: unclipped, pessimistic
    ]
    for r, a, loss, grad in cases:
        assert _one_token(r, a) == (pytest.approx(loss, abs=1e-12), pytest.approx(grad, abs=1e-12))
    # dual clip c = 1.5 caps A = -2, r = 1.6 at c |A| = 3 (from 3.2), with no gradient
    value, g = _one_token(1.6, -2.0, dual_clip=1.5)
    assert (value, g) == (pytest.approx(3.0), 0.0)


@pytest.mark.parametrize("agg", LOSS_AGG_MODES)
@pytest.mark.parametrize("dual_clip", [None, 1.5])
@pytest.mark.parametrize("weights", [None, "seq", "token"])
def test_ppo_loss_and_gradient_equal_the_reference(agg, dual_clip, weights) -> None:
    w = {
        None: None,
        "seq": torch.tensor([0.5, 1.0, 1 / 3], dtype=F64),
        "token": torch.linspace(0.1, 2.0, 21, dtype=F64).reshape(3, 7),
    }[weights]
    clip = (CLIP_LOW, CLIP_HIGH, dual_clip)
    _assert_same(
        lambda x: ppo_policy_loss(x, OLD_LOGP, ADV, MASK, *clip, agg, weights=w).loss,
        lambda x: ppo_clip_loss_ref(x, OLD_LOGP, ADV, MASK, *clip, agg, weights=w),
        LOGP,
    )


def test_ppo_loss_takes_one_advantage_per_sequence() -> None:
    adv = torch.tensor([1.5, -2.0, 0.0], dtype=F64)
    _assert_same(
        lambda x: ppo_policy_loss(x, OLD_LOGP, adv, MASK, CLIP_LOW, CLIP_HIGH).loss,
        lambda x: ppo_clip_loss_ref(x, OLD_LOGP, adv, MASK, CLIP_LOW, CLIP_HIGH),
        LOGP,
    )


@pytest.mark.parametrize("agg", LOSS_AGG_MODES)
@pytest.mark.parametrize(("cap", "mode"), [(5.0, "truncate"), (5.0, "mask"), (None, "truncate")])
def test_decoupled_ppo_loss_and_gradient_equal_the_reference(agg, cap, mode) -> None:
    prox = LOGP - torch.tensor([0.3, -0.1, 0.25, 0.0, -0.3, 0.1, 0.5], dtype=F64)  # trust region
    behav = prox - PROX_MINUS_BEHAV
    kw = {"behav_weight_cap": cap, "behav_weight_mode": mode}
    args = (ADV, MASK, CLIP_LOW, CLIP_HIGH, 1.5, agg)
    _assert_same(
        lambda x: ppo_policy_loss(x, prox, *args, behav_logp=behav, **kw).loss,
        lambda x: decoupled_ppo_loss_ref(x, prox, behav, *args, **kw),
        LOGP,
    )


def test_reference_decoupled_ppo_with_prox_equal_behav_is_ppo() -> None:
    a = decoupled_ppo_loss_ref(LOGP, OLD_LOGP, OLD_LOGP, ADV, MASK, CLIP_LOW, CLIP_HIGH)
    b = ppo_clip_loss_ref(LOGP, OLD_LOGP, ADV, MASK, CLIP_LOW, CLIP_HIGH)
    torch.testing.assert_close(a, b, **TOL)


@pytest.mark.parametrize("agg", LOSS_AGG_MODES)
def test_policy_gradient_loss_equals_the_reference(agg) -> None:
    w = torch.tensor([0.5, 1.0, 2.0], dtype=F64)
    _assert_same(
        lambda x: policy_gradient_loss(x, ADV, MASK, agg, weights=w),
        lambda x: policy_gradient_loss_ref(x, ADV, MASK, agg, weights=w),
        LOGP,
    )


@pytest.mark.parametrize("agg", LOSS_AGG_MODES)
def test_aggregation_equals_the_reference(agg) -> None:
    loss = torch.linspace(-2.0, 3.0, 21, dtype=F64).reshape(3, 7)
    _assert_same(
        lambda x: aggregate_loss(x, MASK, agg), lambda x: aggregate_ref(x, MASK, agg), loss
    )


@pytest.mark.parametrize("kind", ["k1", "k2", "k3"])
def test_kl_penalty_and_gradient_equal_the_reference(kind) -> None:
    ref_logp = LOGP + torch.linspace(-1.5, 1.5, 21, dtype=F64).reshape(3, 7)  # both signs
    per_token = torch.linspace(0.5, 1.5, 21, dtype=F64).reshape(3, 7)  # distinct gradients
    _assert_same(
        lambda x: (kl_penalty(x, ref_logp, kind) * per_token).sum(),
        lambda x: (kl_ref(x, ref_logp, kind) * per_token).sum(),
        LOGP,
    )


# ---------------------------------------------------------------------------- GRPO
REWARDS = torch.tensor([1.0, 0.0, 0.0, 1.0, 2.0, 2.0, 2.0, 2.0, 3.0, -1.0, 0.5, 0.0], dtype=F64)


def test_reference_grpo_by_hand() -> None:
    adv = grpo_advantages_ref(REWARDS, 4)
    # [1, 0, 0, 1]: mean 1/2, unbiased std sqrt(1/3): +-0.866; the equal group: exactly 0
    assert adv[:4].tolist() == pytest.approx([0.866025, -0.866025, -0.866025, 0.866025], abs=1e-5)
    assert adv[4:8].tolist() == [0.0] * 4


@pytest.mark.parametrize("scale", ["group", "batch", "none"])
@pytest.mark.parametrize("group_size", [1, 2, 4, 12])
def test_grpo_advantages_equal_the_reference(scale, group_size) -> None:
    torch.testing.assert_close(
        grpo_advantages(REWARDS, group_size, scale),
        grpo_advantages_ref(REWARDS, group_size, scale),
        **TOL,
    )


# ---------------------------------------------------------------------------- V-trace
def test_reference_vtrace_matches_scalable_agents_published_case() -> None:
    # deepmind/scalable_agent vtrace_test.py; the same numbers as tests/rl/algo/test_vtrace.py
    vs, pg = vtrace_ref(
        torch.tensor([-2.5, -1.5, -0.5, 0.5, 1.5], dtype=F64)[:, None],
        torch.full((5, 1), 0.9, dtype=F64),
        torch.arange(5, dtype=F64)[:, None],
        torch.arange(5, dtype=F64)[:, None],
        torch.tensor([1.0], dtype=F64),
        rho_bar=3.7,
        pg_rho_bar=2.2,
    )
    assert vs.flatten().tolist() == pytest.approx(
        [0.200182, 2.709682, 8.513628, 11.932397, 7.33], abs=1e-5
    )
    assert pg.flatten().tolist() == pytest.approx(
        [0.200182, 1.709682, 6.513628, 10.876614, 1.98], abs=1e-5
    )


# T=5, B=2: rho = e^x on both sides of rho_bar = 1.5 and of c_bar = 1; an episode end (0)
LOG_RHOS = torch.tensor(
    [[-2.5, 0.8], [-1.5, -0.3], [-0.5, 1.2], [0.5, 0.0], [1.5, -1.0]], dtype=F64
)
DISCOUNTS = torch.tensor([[0.9, 0.9], [0.9, 0.0], [0.9, 0.95], [0.9, 1.0], [0.9, 0.9]], dtype=F64)
STEP_REWARDS = torch.tensor(
    [[0.0, 1.0], [1.0, -0.5], [2.0, 0.0], [3.0, 2.0], [4.0, 1.0]], dtype=F64
)
VALUES = torch.tensor([[0.5, 0.2], [1.0, -0.4], [2.5, 0.3], [3.0, 1.5], [4.0, 0.7]], dtype=F64)
BOOTSTRAP = torch.tensor([1.0, -0.6], dtype=F64)


@pytest.mark.parametrize("lambda_", [1.0, 0.8])
@pytest.mark.parametrize(("rho_bar", "pg_rho_bar"), [(1.5, 1.2), (1.0, 1.0), (None, None)])
def test_vtrace_equals_the_reference(rho_bar, pg_rho_bar, lambda_) -> None:
    args = (LOG_RHOS, DISCOUNTS, STEP_REWARDS, VALUES, BOOTSTRAP)
    out = vtrace(*args, rho_bar, pg_rho_bar, lambda_)
    vs, pg = vtrace_ref(*args, rho_bar=rho_bar, pg_rho_bar=pg_rho_bar, lambda_=lambda_)
    torch.testing.assert_close(out.vs, vs, **TOL)
    torch.testing.assert_close(out.pg_advantages, pg, **TOL)


def test_vtrace_policy_gradient_loss_and_gradient_equal_the_reference() -> None:
    """IMPALA's policy loss, end to end: V-trace advantages (rho_bar 1.5, pg_rho_bar 1.2) of
    the learner's log-probs, then ``-A log pi``; the advantages are constants."""
    behav = -1.0 - 0.1 * torch.arange(10, dtype=F64).reshape(2, 5)  # (B, T)
    logp = behav + LOG_RHOS.t()  # (B, T)
    mask = torch.ones(2, 5, dtype=F64)
    targets = (DISCOUNTS, STEP_REWARDS, VALUES, BOOTSTRAP)

    def package(x: torch.Tensor) -> torch.Tensor:
        ret = vtrace((x - behav).t(), *targets, 1.5, 1.2)
        return policy_gradient_loss(x, ret.pg_advantages.t(), mask)

    def reference(x: torch.Tensor) -> torch.Tensor:
        _, pg = vtrace_ref((x - behav).t().detach(), *targets, rho_bar=1.5, pg_rho_bar=1.2)
        return policy_gradient_loss_ref(x, pg.t(), mask)

    _assert_same(package, reference, logp)


# ---------------------------------------------------------------------------- staleness
@pytest.mark.parametrize("kind", ["inverse", "exp", "none"])
@pytest.mark.parametrize("half_life", [1.0, 2.5])
def test_staleness_weight_equals_the_reference(kind, half_life) -> None:
    lags = [0, 1, 2, 3, 7, 0.5]
    expected = [staleness_weight_ref(g, kind, half_life) for g in lags]
    got = [staleness_weight(g, kind, half_life=half_life) for g in lags]
    assert got == pytest.approx(expected, rel=1e-12)
    as_tensor = staleness_weight(torch.tensor(lags, dtype=F64), kind, half_life=half_life)
    torch.testing.assert_close(as_tensor, torch.tensor(expected, dtype=F64), **TOL)
    if kind == "inverse":
        assert expected[:4] == [1.0, 0.5, 1 / 3, 0.25]  # 1 / (1 + lag), by hand


# ---------------------------------------------------------------------------- properties
def _matrix(draw, rows: int, cols: int, lo: float, hi: float) -> torch.Tensor:
    flat = draw(st.lists(st.floats(lo, hi), min_size=rows * cols, max_size=rows * cols))
    return torch.tensor(flat, dtype=F64).reshape(rows, cols)


@st.composite
def _batches(draw):
    """(logp, old_logp, advantages, mask) with ratios in [e^-1, e^1] and random masks."""
    b, t = draw(st.integers(1, 3)), draw(st.integers(1, 5))
    old = _matrix(draw, b, t, -3.0, 0.0)
    logp = old + _matrix(draw, b, t, -1.0, 1.0)
    adv = _matrix(draw, b, t, -3.0, 3.0)
    mask = (_matrix(draw, b, t, 0.0, 1.0) > 0.3).to(F64)
    return logp, old, adv, mask


_clips = st.tuples(st.floats(0.0, 0.5), st.floats(0.0, 0.5), st.none() | st.floats(1.5, 4.0))


@settings(max_examples=60)
@given(batch=_batches(), clip=_clips, agg=st.sampled_from(LOSS_AGG_MODES), data=st.data())
def test_ppo_property(batch, clip, agg, data) -> None:
    logp, old, adv, mask = batch
    weights = _matrix(data.draw, *logp.shape, 0.0, 2.0) if data.draw(st.booleans()) else None
    _assert_same(
        lambda x: ppo_policy_loss(x, old, adv, mask, *clip, agg, weights=weights).loss,
        lambda x: ppo_clip_loss_ref(x, old, adv, mask, *clip, agg, weights=weights),
        logp,
    )


@settings(max_examples=60)
@given(
    batch=_batches(),
    clip=_clips,
    agg=st.sampled_from(LOSS_AGG_MODES),
    cap=st.none() | st.floats(0.5, 3.0),
    mode=st.sampled_from(["truncate", "mask"]),
    data=st.data(),
)
def test_decoupled_ppo_property(batch, clip, agg, cap, mode, data) -> None:
    logp, prox, adv, mask = batch
    behav = prox + _matrix(data.draw, *logp.shape, -1.5, 1.5)
    kw = {"behav_weight_cap": cap, "behav_weight_mode": mode}
    _assert_same(
        lambda x: ppo_policy_loss(x, prox, adv, mask, *clip, agg, behav_logp=behav, **kw).loss,
        lambda x: decoupled_ppo_loss_ref(x, prox, behav, adv, mask, *clip, agg, **kw),
        logp,
    )


@settings(max_examples=40)
@given(batch=_batches(), kind=st.sampled_from(["k1", "k2", "k3"]))
def test_kl_property(batch, kind) -> None:
    logp, ref_logp, weights, _ = batch
    _assert_same(
        lambda x: (kl_penalty(x, ref_logp, kind) * weights).sum(),
        lambda x: (kl_ref(x, ref_logp, kind) * weights).sum(),
        logp,
    )


@settings(max_examples=60)
@given(
    rewards=st.lists(st.sampled_from([-2.0, -0.5, 0.0, 0.25, 1.0, 3.0]), min_size=1, max_size=12),
    group_size=st.integers(1, 4),
    scale=st.sampled_from(["group", "batch", "none"]),
)
def test_grpo_property(rewards, group_size, scale) -> None:
    """Rewards from a small set, so "all equal" is exact in both (the package also zeroes a
    group whose spread is a few ulps, which a reference of exact arithmetic would not)."""
    rewards = rewards[: len(rewards) // group_size * group_size] or rewards[:1] * group_size
    r = torch.tensor(rewards, dtype=F64)
    torch.testing.assert_close(
        grpo_advantages(r, group_size, scale), grpo_advantages_ref(r, group_size, scale), **TOL
    )


@settings(max_examples=60)
@given(
    shape=st.tuples(st.integers(1, 6), st.integers(1, 3)),
    bars=st.tuples(st.none() | st.floats(0.3, 3.0), st.none() | st.floats(0.3, 3.0)),
    lambda_=st.floats(0.0, 1.0),
    data=st.data(),
)
def test_vtrace_property(shape, bars, lambda_, data) -> None:
    t, b = shape
    gamma = data.draw(
        st.lists(st.sampled_from([0.0, 0.5, 0.9, 1.0]), min_size=t * b, max_size=t * b)
    )
    args = (
        _matrix(data.draw, t, b, -2.0, 2.0),
        torch.tensor(gamma, dtype=F64).reshape(t, b),
        _matrix(data.draw, t, b, -1.0, 1.0),
        _matrix(data.draw, t, b, -2.0, 2.0),
        _matrix(data.draw, 1, b, -2.0, 2.0).reshape(b),
    )
    out = vtrace(*args, bars[0], bars[1], lambda_)
    vs, pg = vtrace_ref(*args, rho_bar=bars[0], pg_rho_bar=bars[1], lambda_=lambda_)
    torch.testing.assert_close(out.vs, vs, **TOL)
    torch.testing.assert_close(out.pg_advantages, pg, **TOL)


@given(
    lag=st.integers(0, 50) | st.floats(0.0, 50.0),
    kind=st.sampled_from(["inverse", "exp", "none"]),
    half_life=st.floats(0.25, 8.0),
)
def test_staleness_property(lag, kind, half_life) -> None:
    expected = staleness_weight_ref(lag, kind, half_life)
    assert staleness_weight(lag, kind, half_life=half_life) == pytest.approx(expected, rel=1e-12)


def test_the_references_share_no_code_with_what_they_check() -> None:
    import ast
    from pathlib import Path

    tree = ast.parse((Path(__file__).parent / "reference.py").read_text())
    imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert not [m for m in imported if m.startswith(("nobubble", "tests"))], imported
