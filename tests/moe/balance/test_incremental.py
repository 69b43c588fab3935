"""rebalance_experts_incremental: valid placements within the target, fewer moves than fresh."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from nobubble.moe.balance.eplb import gpu_loads, rebalance_experts
from nobubble.moe.balance.incremental import count_moves, rebalance_experts_incremental
from tests.moe.balance.eplb_cases import check_invariants, problems


def moves_slow(old_row, new_row, num_gpus):
    per_gpu = len(old_row) // num_gpus
    total = 0
    for g in range(num_gpus):
        old = Counter(old_row[g * per_gpu : (g + 1) * per_gpu])
        new = Counter(new_row[g * per_gpu : (g + 1) * per_gpu])
        total += sum((new - old).values())
    return total


def imbalance(weight, phy2log, num_gpus):
    loads = gpu_loads(weight, phy2log, num_gpus)
    mean = loads.mean(-1)
    return torch.where(mean > 0, loads.max(-1).values / mean, 1.0)  # nothing loaded: balanced


@settings(max_examples=60, deadline=None)
@given(problems(), st.integers(0, 2**31 - 1), st.sampled_from([0.0, 0.02, 0.1]))
def test_incremental_properties(problem, seed, tolerance):
    weight, num_replicas, num_groups, num_nodes, num_gpus = problem
    current = rebalance_experts(weight, num_replicas, num_groups, num_nodes, num_gpus)
    # new loads: the old ones perturbed, with some experts going cold or hot
    rng = np.random.default_rng(seed)
    new_weight = weight.double() * torch.tensor(rng.lognormal(0.0, 0.7, tuple(weight.shape)))
    result = rebalance_experts_incremental(
        new_weight, current.phy2log, num_groups, num_nodes, num_gpus, tolerance=tolerance
    )
    check_invariants(result.placement, new_weight, num_groups, num_nodes, num_gpus, True)
    imb = imbalance(new_weight, result.placement.phy2log, num_gpus)
    fresh = rebalance_experts(new_weight, num_replicas, num_groups, num_nodes, num_gpus)
    fresh_imb = imbalance(new_weight, fresh.phy2log, num_gpus)
    assert torch.allclose(result.fresh_imbalance, fresh_imb)
    assert (imb <= fresh_imb + tolerance + 1e-9).all()
    for layer in range(weight.shape[0]):
        old_row = current.phy2log[layer].tolist()
        assert int(result.num_moved[layer]) == moves_slow(
            old_row, result.placement.phy2log[layer].tolist(), num_gpus
        )
        assert int(result.num_moved_fresh[layer]) == moves_slow(
            old_row, fresh.phy2log[layer].tolist(), num_gpus
        )
    assert (result.num_moved <= result.num_moved_fresh).all()


@settings(max_examples=40, deadline=None)
@given(problems())
def test_unchanged_loads_move_nothing(problem):
    weight, num_replicas, num_groups, num_nodes, num_gpus = problem
    current = rebalance_experts(weight, num_replicas, num_groups, num_nodes, num_gpus)
    result = rebalance_experts_incremental(
        weight, current.phy2log, num_groups, num_nodes, num_gpus, tolerance=0.0
    )
    assert result.num_moved.tolist() == [0] * weight.shape[0]


def test_count_moves_counts_new_experts_per_gpu():
    old = torch.tensor([[0, 1, 2, 3, 0, 2]])  # GPUs: {0,1} {2,3} {0,2}
    new = torch.tensor([[1, 0, 3, 0, 2, 1]])  # GPU0 same set, GPU1 gains 0, GPU2 gains 1
    assert count_moves(old, new, 3).tolist() == [2]


def test_deepseek_v3_like_drift_moves_few_experts():
    """256 experts, 8 groups, 4 nodes, 32 GPUs, 32 redundant; loads drift by 20%."""
    rng = np.random.default_rng(3)
    weight = torch.tensor(rng.pareto(2.0, (2, 256)) + 1.0)
    current = rebalance_experts(weight, 288, 8, 4, 32)
    drifted = weight * torch.tensor(rng.lognormal(0.0, 0.2, (2, 256)))
    result = rebalance_experts_incremental(drifted, current.phy2log, 8, 4, 32)
    assert (result.imbalance <= result.fresh_imbalance + 0.02 + 1e-9).all()
    assert (result.num_moved * 4 < result.num_moved_fresh).all()  # far fewer than a reshuffle
    assert result.placement.duplicate_gpus().sum() == 0


def test_incremental_bad_input():
    weight = torch.ones(1, 12)
    current = rebalance_experts(weight, 16, 4, 2, 8).phy2log
    with pytest.raises(ValueError, match="tolerance=-1"):
        rebalance_experts_incremental(weight, current, 4, 2, 8, tolerance=-1)
    with pytest.raises(ValueError, match="max_imbalance=0.5"):
        rebalance_experts_incremental(weight, current, 4, 2, 8, max_imbalance=0.5)
    with pytest.raises(ValueError, match="current_phy2log must be"):
        rebalance_experts_incremental(weight, current[0], 4, 2, 8)
    with pytest.raises(ValueError, match="no replica"):
        rebalance_experts_incremental(weight, torch.zeros(1, 16, dtype=torch.int64), 4, 2, 8)


def test_incremental_from_an_eplb_placement_with_duplicates():
    """Starting from EPLB's own placement (two replicas of an expert on one GPU), the new
    placement has no duplicates, meets its target and moves fewer experts than a fresh one."""
    from nobubble.moe.balance.eplb_reference import reference_rebalance_experts

    rng = np.random.default_rng(7)
    weight = torch.tensor(rng.pareto(2.0, (2, 256)) + 1.0)
    current, _, _ = reference_rebalance_experts(weight, 288, 8, 4, 32)
    per_gpu = current.view(2, 32, 9).sort(-1).values
    assert (per_gpu[..., 1:] == per_gpu[..., :-1]).any()  # EPLB doubled some expert up
    result = rebalance_experts_incremental(weight, current, 8, 4, 32)
    check_invariants(result.placement, weight, 8, 4, 32, hierarchical=True)
    assert (result.imbalance <= result.max_imbalance + 1e-9).all()
    assert (result.num_moved < result.num_moved_fresh).all()
