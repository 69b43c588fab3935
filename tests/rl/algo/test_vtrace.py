"""V-trace against scalable_agent's published case and a brute-force sum from the paper."""

from __future__ import annotations

import ast
import math
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import nobubble.rl
from nobubble.rl.algo import vtrace, vtrace_from_logits


def test_scalable_agent_published_case() -> None:
    # deepmind/scalable_agent vtrace_test.py, test_vtrace_from_importance_weights-style case:
    # T=5, B=1, log_rhos=[-2.5..1.5], gamma=0.9, rewards=values=[0..4], bootstrap=1.
    T = 5
    out = vtrace(
        log_rhos=torch.tensor([-2.5, -1.5, -0.5, 0.5, 1.5], dtype=torch.float64).reshape(T, 1),
        discounts=torch.full((T, 1), 0.9, dtype=torch.float64),
        rewards=torch.arange(5, dtype=torch.float64).reshape(T, 1),
        values=torch.arange(5, dtype=torch.float64).reshape(T, 1),
        bootstrap_value=torch.tensor([1.0], dtype=torch.float64),
        clip_rho_threshold=3.7,
        clip_pg_rho_threshold=2.2,
    )
    vs = [0.200182, 2.709682, 8.513628, 11.932397, 7.33]
    pg = [0.200182, 1.709682, 6.513628, 10.876614, 1.98]
    assert out.vs.flatten().tolist() == pytest.approx(vs, abs=1e-5)
    assert out.pg_advantages.flatten().tolist() == pytest.approx(pg, abs=1e-5)


def _brute_force(log_rhos, discounts, rewards, values, bootstrap, rho_bar, pg_rho_bar, lam):
    """IMPALA eq. (1) written as the explicit sum over s >= t, one scalar sequence."""
    T = len(rewards)
    rhos = [math.exp(x) for x in log_rhos]
    v = list(values) + [bootstrap]  # V(x_0) .. V(x_T)
    vs = []
    for t in range(T):
        total = v[t]
        for s in range(t, T):
            weight = 1.0  # prod_{i=t}^{s-1} gamma_i c_i
            for i in range(t, s):
                weight *= discounts[i] * lam * min(1.0, rhos[i])
            delta = min(rho_bar, rhos[s]) * (rewards[s] + discounts[s] * v[s + 1] - v[s])
            total += weight * delta
        vs.append(total)
    vs_next = vs[1:] + [bootstrap]
    pg = [
        min(pg_rho_bar, rhos[t])
        * (rewards[t] + discounts[t] * (lam * vs_next[t] + (1 - lam) * v[t + 1]) - v[t])
        for t in range(T)
    ]
    return vs, pg


@pytest.mark.parametrize("lam", [0.0, 0.6, 0.95, 1.0])
def test_matches_brute_force_with_trailing_dims(lam: float) -> None:
    g = torch.Generator().manual_seed(int(lam * 100))
    T, B, K = 7, 3, 2
    shape = (T, B, K)
    log_rhos = torch.randn(shape, generator=g, dtype=torch.float64)
    discounts = 0.95 * (torch.rand(shape, generator=g, dtype=torch.float64) > 0.15)  # some ends
    rewards = torch.randn(shape, generator=g, dtype=torch.float64)
    values = torch.randn(shape, generator=g, dtype=torch.float64)
    bootstrap = torch.randn((B, K), generator=g, dtype=torch.float64)
    out = vtrace(log_rhos, discounts, rewards, values, bootstrap, 1.3, 0.8, lambda_=lam)
    for b in range(B):
        for k in range(K):
            vs, pg = _brute_force(
                log_rhos[:, b, k].tolist(),
                discounts[:, b, k].tolist(),
                rewards[:, b, k].tolist(),
                values[:, b, k].tolist(),
                bootstrap[b, k].item(),
                1.3,
                0.8,
                lam,
            )
            assert out.vs[:, b, k].tolist() == pytest.approx(vs, abs=1e-5)
            assert out.pg_advantages[:, b, k].tolist() == pytest.approx(pg, abs=1e-5)


def test_no_clipping_and_on_policy_gives_discounted_return() -> None:
    # On-policy (rho = 1), lambda = 1: vs_t is the n-step bootstrapped discounted return.
    T = 4
    rewards = torch.tensor([[1.0], [2.0], [3.0], [4.0]])
    values = torch.tensor([[0.5], [-1.0], [2.0], [0.0]])
    out = vtrace(
        torch.zeros(T, 1), torch.full((T, 1), 0.5), rewards, values, torch.tensor([8.0]), None, None
    )
    expected = [1 + 0.5 * 2 + 0.25 * 3 + 0.125 * 4 + 0.0625 * 8, 2 + 0.5 * 3 + 0.25 * 4 + 0.125 * 8]
    assert out.vs[:2, 0].tolist() == pytest.approx(expected)


def test_targets_carry_no_gradient() -> None:
    T, B = 3, 2
    values = torch.randn(T, B, requires_grad=True)
    log_rhos = torch.randn(T, B, requires_grad=True)
    out = vtrace(log_rhos, torch.full((T, B), 0.9), torch.randn(T, B), values, torch.zeros(B))
    assert not out.vs.requires_grad and not out.pg_advantages.requires_grad


def test_from_logits_matches_explicit_softmax() -> None:
    g = torch.Generator().manual_seed(3)
    T, B, A = 6, 2, 4
    mu_logits = torch.randn(T, B, A, generator=g, dtype=torch.float64)
    pi_logits = torch.randn(T, B, A, generator=g, dtype=torch.float64, requires_grad=True)
    actions = torch.randint(0, A, (T, B), generator=g)
    discounts = torch.full((T, B), 0.9, dtype=torch.float64)
    rewards = torch.randn(T, B, generator=g, dtype=torch.float64)
    values = torch.randn(T, B, generator=g, dtype=torch.float64)
    bootstrap = torch.randn(B, generator=g, dtype=torch.float64)
    out = vtrace_from_logits(
        mu_logits, pi_logits, actions, discounts, rewards, values, bootstrap, lambda_=0.9
    )
    for t in range(T):
        for b in range(B):
            a = actions[t, b].item()
            pi = math.exp(pi_logits[t, b, a].item()) / sum(
                math.exp(x) for x in pi_logits[t, b].tolist()
            )
            mu = math.exp(mu_logits[t, b, a].item()) / sum(
                math.exp(x) for x in mu_logits[t, b].tolist()
            )
            assert out.log_rhos[t, b].item() == pytest.approx(math.log(pi / mu), abs=1e-9)
            assert out.target_action_log_probs[t, b].item() == pytest.approx(math.log(pi), abs=1e-9)
    direct = vtrace(out.log_rhos, discounts, rewards, values, bootstrap, lambda_=0.9)
    torch.testing.assert_close(out.vs, direct.vs)
    torch.testing.assert_close(out.pg_advantages, direct.pg_advantages)
    assert out.target_action_log_probs.requires_grad and not out.vs.requires_grad


def test_bad_input_names_the_value() -> None:
    T, B = 3, 2
    x = torch.zeros(T, B)
    with pytest.raises(ValueError, match="bootstrap_value"):
        vtrace(x, x, x, x, torch.zeros(T))
    with pytest.raises(ValueError, match="rewards"):
        vtrace(x, x, torch.zeros(T, B + 1), x, torch.zeros(B))
    with pytest.raises(ValueError, match="lambda_=1.5"):
        vtrace(x, x, x, x, torch.zeros(B), lambda_=1.5)
    with pytest.raises(ValueError, match="clip_rho_threshold=0"):
        vtrace(x, x, x, x, torch.zeros(B), clip_rho_threshold=0)


def _gae_brute(rewards, values, bootstrap, discounts, lam):
    """GAE as Schulman et al. (2016) sum it: A_t = sum_s (prod gamma lambda) delta_s."""
    T = len(rewards)
    v = list(values) + [bootstrap]
    deltas = [rewards[t] + discounts[t] * v[t + 1] - v[t] for t in range(T)]
    adv = []
    for t in range(T):
        total, weight = 0.0, 1.0
        for s in range(t, T):
            total += weight * deltas[s]
            weight *= discounts[s] * lam
        adv.append(total)
    return adv


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 8), st.floats(0.0, 1.0), st.integers(0, 2**31 - 1))
def test_on_policy_vtrace_is_gae(T, lam, seed) -> None:
    # With rho = 1 everywhere, c_t = lambda: V-trace's pg_advantages are GAE(lambda)'s
    # advantages and vs their returns (advantage + value), GAE's explicit sum.
    g = torch.Generator().manual_seed(seed)
    B = 2
    rewards = torch.randn(T, B, generator=g, dtype=torch.float64)
    values = torch.randn(T, B, generator=g, dtype=torch.float64)
    bootstrap = torch.randn(B, generator=g, dtype=torch.float64)
    discounts = 0.9 * (torch.rand(T, B, generator=g, dtype=torch.float64) > 0.2)
    out = vtrace(
        torch.zeros(T, B, dtype=torch.float64), discounts, rewards, values, bootstrap, lambda_=lam
    )
    for b in range(B):
        expect = _gae_brute(
            rewards[:, b].tolist(),
            values[:, b].tolist(),
            bootstrap[b].item(),
            discounts[:, b].tolist(),
            lam,
        )
        assert out.pg_advantages[:, b].tolist() == pytest.approx(expect, abs=1e-9)
    torch.testing.assert_close(out.vs, out.pg_advantages + values)


def test_no_jax_or_tensorflow_import() -> None:
    banned = {"jax", "jaxlib", "tensorflow", "tf_keras", "flax", "rlax"}
    for path in Path(nobubble.rl.__file__).parent.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            assert not {n.split(".")[0] for n in names} & banned, f"{path} imports {names}"


def test_scalar_discount_equals_constant_tensor() -> None:
    T, B = 4, 2
    x = torch.randn(T, B, dtype=torch.float64)
    a = vtrace(x, 0.9, x.cos(), x.sin(), torch.ones(B, dtype=torch.float64), lambda_=0.8)
    b = vtrace(
        x,
        torch.full((T, B), 0.9, dtype=torch.float64),
        x.cos(),
        x.sin(),
        torch.ones(B, dtype=torch.float64),
        lambda_=0.8,
    )
    torch.testing.assert_close(a.vs, b.vs)
    torch.testing.assert_close(a.pg_advantages, b.pg_advantages)
