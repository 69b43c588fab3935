"""GRPO advantages and GAE against hand values, brute force and properties."""

from __future__ import annotations

import statistics

import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

from nobubble.rl.algo import grpo_advantages

EPS = 1e-6


def test_issue_example_unbiased_std() -> None:
    adv = grpo_advantages(torch.tensor([1.0, 0.0, 0.0, 1.0]), group_size=4)
    # mean 0.5, unbiased std sqrt(1/3): 0.5 / 0.57735 = 0.866025
    assert adv.tolist() == pytest.approx([0.866025, -0.866025, -0.866025, 0.866025], abs=1e-5)


def test_zero_variance_and_singleton_groups_give_zero() -> None:
    rewards = torch.tensor([1.0, 1.0, 1.0, 0.0, 1.0, 0.5])
    adv = grpo_advantages(rewards, group_size=3)
    assert adv[:3].tolist() == [0.0, 0.0, 0.0]
    assert adv[3:].abs().sum() > 0
    for scale in ("group", "batch", "none"):
        assert grpo_advantages(rewards, group_size=1, scale=scale).tolist() == [0.0] * 6


def _brute(rewards: list[float], group_size: int, scale: str) -> list[float]:
    out = []
    batch_std = statistics.stdev(rewards) if len(rewards) > 1 else 0.0
    for g in range(0, len(rewards), group_size):
        group = rewards[g : g + group_size]
        mean = statistics.fmean(group)
        std = statistics.stdev(group) if len(group) > 1 else 0.0
        for r in group:
            if len(group) == 1:
                out.append(0.0)
            elif scale == "group":
                out.append((r - mean) / (std + EPS))
            elif scale == "batch":
                out.append((r - mean) / (batch_std + EPS))
            else:
                out.append(r - mean)
    return out


rewards_and_groups = st.integers(1, 6).flatmap(
    lambda gs: st.tuples(
        st.just(gs),
        st.integers(1, 5).flatmap(
            lambda ng: st.lists(
                st.sampled_from([0.0, 0.25, 1.0, -2.0, 3.5]), min_size=gs * ng, max_size=gs * ng
            )
        ),
    )
)


@settings(max_examples=60, deadline=None)
@given(rewards_and_groups, st.sampled_from(["group", "batch", "none"]))
def test_matches_statistics_module(gs_rewards, scale) -> None:
    group_size, rewards = gs_rewards
    adv = grpo_advantages(
        torch.tensor(rewards, dtype=torch.float64), group_size, scale=scale, eps=EPS
    )
    assert adv.tolist() == pytest.approx(_brute(rewards, group_size, scale), abs=1e-9)


@settings(max_examples=60, deadline=None)
@given(rewards_and_groups, st.sampled_from(["group", "batch", "none"]))
def test_each_group_sums_to_zero_and_scale_is_unit(gs_rewards, scale) -> None:
    group_size, rewards = gs_rewards
    r = torch.tensor(rewards, dtype=torch.float64)
    adv = grpo_advantages(r, group_size, scale=scale).reshape(-1, group_size)
    assert adv.sum(dim=1).abs().max().item() < 1e-9
    if scale == "group" and group_size > 1:
        spread = r.reshape(-1, group_size).std(dim=1)
        has_signal = spread > 0.1
        assert torch.allclose(
            adv.std(dim=1)[has_signal], torch.ones(1, dtype=torch.float64), atol=1e-4
        )


@settings(max_examples=40, deadline=None)
@given(
    rewards_and_groups,
    st.floats(0.5, 10.0),
    st.floats(-5.0, 5.0),
)
@example((3, [-2.0, -2.0, -2.0]), 6.0, 1.3087219907431624)  # equal rewards, rounding in the mean
def test_group_scale_is_affine_invariant(gs_rewards, a, b) -> None:
    group_size, rewards = gs_rewards
    r = torch.tensor(rewards, dtype=torch.float64)
    adv = grpo_advantages(r, group_size, eps=1e-12)
    adv2 = grpo_advantages(a * r + b, group_size, eps=1e-12)
    torch.testing.assert_close(adv, adv2, atol=1e-6, rtol=1e-6)


@settings(max_examples=40, deadline=None)
@given(rewards_and_groups, st.randoms(use_true_random=False))
def test_permutation_within_group_is_equivariant(gs_rewards, rnd) -> None:
    group_size, rewards = gs_rewards
    perm = []
    for g in range(0, len(rewards), group_size):
        idx = list(range(g, g + group_size))
        rnd.shuffle(idx)
        perm += idx
    r = torch.tensor(rewards, dtype=torch.float64)
    p = torch.tensor(perm)
    torch.testing.assert_close(grpo_advantages(r[p], group_size), grpo_advantages(r, group_size)[p])


def test_grpo_bad_input() -> None:
    with pytest.raises(ValueError, match="group_size=3"):
        grpo_advantages(torch.zeros(4), 3)
    with pytest.raises(ValueError, match="scale='std'"):
        grpo_advantages(torch.zeros(4), 2, scale="std")
    with pytest.raises(ValueError, match=r"shape \(2, 2\)"):
        grpo_advantages(torch.zeros(2, 2), 2)
