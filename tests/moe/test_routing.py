"""Routers against brute-force per-token implementations; the aux-loss-free bias update."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from nobubble.moe import softmax_topk
from nobubble.moe.routing import deepseek_v3_topk, update_expert_bias


def _brute_v3(logits, topk, n_groups, topk_groups, bias, route_scale):
    """DeepSeek-V3 gating written out token by token."""
    idx_rows, w_rows = [], []
    num_experts = len(bias)
    per_group = num_experts // n_groups
    for row in logits:
        s = [1 / (1 + math.exp(-v)) for v in row]
        b = [s[e] + bias[e] for e in range(num_experts)]
        group_score = [
            sum(sorted(b[g * per_group : (g + 1) * per_group], reverse=True)[: min(2, per_group)])
            for g in range(n_groups)
        ]
        groups = sorted(range(n_groups), key=lambda g: -group_score[g])[:topk_groups]
        eligible = [e for e in range(num_experts) if e // per_group in groups]
        chosen = sorted(eligible, key=lambda e: -b[e])[:topk]
        total = sum(s[e] for e in chosen)
        idx_rows.append(chosen)
        w_rows.append([s[e] / total * route_scale for e in chosen])
    return idx_rows, w_rows


@st.composite
def v3_case(draw):
    n_groups = draw(st.sampled_from([1, 2, 4]))
    per_group = draw(st.integers(1, 4))
    num_experts = n_groups * per_group
    topk_groups = draw(st.integers(1, n_groups))
    topk = draw(st.integers(1, topk_groups * per_group))
    seed = draw(st.integers(0, 10_000))
    num_tokens = draw(st.integers(0, 6))
    return num_experts, topk, n_groups, topk_groups, seed, num_tokens


@settings(max_examples=80, deadline=None)
@given(v3_case())
def test_deepseek_v3_matches_brute_force(case):
    num_experts, topk, n_groups, topk_groups, seed, num_tokens = case
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(num_tokens, num_experts, generator=g, dtype=torch.float64)
    bias = torch.randn(num_experts, generator=g, dtype=torch.float64) * 0.1
    r = deepseek_v3_topk(
        logits, topk, n_groups=n_groups, topk_groups=topk_groups, bias=bias, route_scale=2.5
    )
    idx, w = _brute_v3(logits.tolist(), topk, n_groups, topk_groups, bias.tolist(), 2.5)
    assert r.topk_idx.tolist() == idx
    torch.testing.assert_close(
        r.topk_weights, torch.tensor(w, dtype=torch.float64).reshape(num_tokens, topk)
    )


def test_bias_steers_selection_but_not_weights():
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]])
    bias = torch.tensor([0.0, 0.0, 0.0, 10.0])  # forces expert 3 in
    r = deepseek_v3_topk(logits, 2, bias=bias)
    assert sorted(r.topk_idx[0].tolist()) == [0, 3]
    s = logits.sigmoid()[0]
    expected = torch.stack([s[3], s[0]]) / (s[3] + s[0])
    torch.testing.assert_close(r.topk_weights[0], expected)


def test_group_limit_keeps_tokens_in_topk_groups():
    g = torch.Generator().manual_seed(0)
    r = deepseek_v3_topk(torch.randn(64, 32, generator=g), 8, n_groups=8, topk_groups=4)
    groups_used = (r.topk_idx // 4).sort(dim=1).values
    assert all(len(set(row)) <= 4 for row in groups_used.tolist())
    torch.testing.assert_close(r.topk_weights.sum(dim=1), torch.ones(64))


def test_weights_carry_router_gradient():
    logits = torch.randn(5, 8, requires_grad=True)
    deepseek_v3_topk(logits, 2, n_groups=2, topk_groups=1).topk_weights[:, 0].sum().backward()
    assert logits.grad.abs().sum() > 0


def test_softmax_topk():
    logits = torch.tensor([[1.0, 3.0, 2.0, 0.0]])
    r = softmax_topk(logits, 2)
    p = logits.softmax(-1)[0]
    assert r.topk_idx.tolist() == [[1, 2]]
    torch.testing.assert_close(r.topk_weights[0], torch.stack([p[1], p[2]]))
    torch.testing.assert_close(
        softmax_topk(logits, 2, normalize=True).topk_weights.sum(), torch.tensor(1.0)
    )


def test_bias_update_sign():
    bias = torch.zeros(4)
    new = update_expert_bias(bias, torch.tensor([10, 2, 6, 6]), rate=0.5)  # mean 6
    assert new.tolist() == [-0.5, 0.5, 0.0, 0.0]


@pytest.mark.parametrize(
    ("call", "needle"),
    [
        (lambda: deepseek_v3_topk(torch.randn(2, 6), 2, n_groups=4), "n_groups=4"),
        (
            lambda: deepseek_v3_topk(torch.randn(2, 8), 2, n_groups=4, topk_groups=5),
            "topk_groups=5",
        ),
        (lambda: deepseek_v3_topk(torch.randn(2, 8), 5, n_groups=4, topk_groups=2), "topk=5"),
        (lambda: softmax_topk(torch.randn(2, 4), 5), "topk=5"),
        (lambda: update_expert_bias(torch.zeros(4), torch.zeros(3), 0.1), "shape"),
    ],
)
def test_bad_router_input(call, needle):
    with pytest.raises(ValueError, match=needle):
        call()


@pytest.mark.parametrize(
    ("dtype", "scored"),
    [(torch.bfloat16, torch.float32), (torch.float16, torch.float32),
     (torch.float32, torch.float32), (torch.float64, torch.float64)],
)  # fmt: skip
def test_routers_score_in_float32_at_least_and_float64_for_float64(dtype, scored):
    logits = torch.randn(5, 8, generator=torch.Generator().manual_seed(0)).to(dtype)
    soft = softmax_topk(logits, 2)
    v3 = deepseek_v3_topk(logits, 2, n_groups=2, bias=torch.zeros(8))
    for r in (soft, v3):
        assert r.scores.dtype == r.topk_weights.dtype == scored
    # the choice is the float32 (or float64) one: bf16 scores would tie where these do not
    want = logits.to(scored).softmax(-1).topk(2, dim=-1)
    assert torch.equal(soft.topk_idx, want.indices) and torch.equal(soft.topk_weights, want.values)
