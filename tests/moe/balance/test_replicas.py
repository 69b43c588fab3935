"""Replica routing: every pair lands on a replica of its own expert, split as each strategy says."""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from nobubble.moe.balance.eplb import rebalance_experts
from nobubble.moe.balance.replicas import STRATEGIES, ReplicaRouter, route_to_replicas


@st.composite
def routed(draw):
    num_log = draw(st.integers(1, 6))
    num_gpus = draw(st.integers(1, 4))
    per_gpu = draw(st.integers(-(-num_log // num_gpus), num_log))
    weight = draw(st.lists(st.integers(0, 50), min_size=num_log, max_size=num_log))
    placement = rebalance_experts(torch.tensor([weight]), per_gpu * num_gpus, 1, 1, num_gpus)
    n, k = draw(st.integers(0, 12)), draw(st.integers(1, 3))
    ids = draw(st.lists(st.integers(-1, num_log - 1), min_size=n * k, max_size=n * k))
    return placement, torch.tensor(ids, dtype=torch.int64).view(n, k)


@settings(max_examples=80, deadline=None)
@given(routed(), st.sampled_from(STRATEGIES))
def test_every_pair_goes_to_a_replica_of_its_expert(case, strategy):
    placement, topk_idx = case
    phys = route_to_replicas(topk_idx, placement.log2phy[0], placement.logcnt[0], strategy=strategy)
    assert phys.shape == topk_idx.shape
    phy2log = placement.phy2log[0].tolist()
    for p, e in zip(phys.view(-1).tolist(), topk_idx.view(-1).tolist()):
        assert (p == -1) if e == -1 else phy2log[p] == e


@settings(max_examples=60, deadline=None)
@given(routed())
def test_round_robin_and_least_loaded_split_evenly(case):
    """Within a batch both give each replica of e either floor or ceil of e's pairs / cnt."""
    placement, topk_idx = case
    phy2log = placement.phy2log[0].tolist()
    pairs = Counter(topk_idx[topk_idx >= 0].tolist())
    for strategy in ("round_robin", "least_loaded"):
        phys = route_to_replicas(
            topk_idx, placement.log2phy[0], placement.logcnt[0], strategy=strategy
        )
        per_replica = Counter(phys[phys >= 0].tolist())
        for p, e in enumerate(phy2log):
            cnt = int(placement.logcnt[0, e])
            assert per_replica[p] in (pairs[e] // cnt, -(-pairs[e] // cnt)), strategy


def test_round_robin_carries_its_counters_across_calls():
    log2phy = torch.tensor([[0, 1, 2], [3, -1, -1]])
    logcnt = torch.tensor([3, 1])
    router = ReplicaRouter(log2phy, logcnt, strategy="round_robin")
    got = [router(torch.tensor([[0], [1], [0]])).view(-1).tolist() for _ in range(3)]
    # expert 0 is seen twice per call: replicas 0,1 then 2,0 then 1,2
    assert got == [[0, 3, 1], [2, 3, 0], [1, 3, 2]]


def test_least_loaded_starts_from_the_prior_load():
    log2phy = torch.tensor([[0, 1]])
    logcnt = torch.tensor([2])
    prior = torch.tensor([5.0, 0.0])  # replica 1 is idle elsewhere: it takes the first five
    phys = route_to_replicas(
        torch.zeros(7, 1, dtype=torch.int64), log2phy, logcnt,
        strategy="least_loaded", replica_load=prior,
    )  # fmt: skip
    assert Counter(phys.view(-1).tolist()) == {1: 6, 0: 1}


def test_token_hash_is_a_function_of_the_token():
    log2phy = torch.tensor([[0, 1, 2, 3]])
    logcnt = torch.tensor([4])
    idx = torch.zeros(1000, 1, dtype=torch.int64)
    ids = torch.arange(1000) + 12345
    a = route_to_replicas(idx, log2phy, logcnt, strategy="token_hash", token_ids=ids)
    b = route_to_replicas(
        idx.flip(0), log2phy, logcnt, strategy="token_hash", token_ids=ids.flip(0)
    )
    assert torch.equal(a, b.flip(0))  # same token -> same replica, whatever the batch order
    counts = Counter(a.view(-1).tolist())
    assert all(200 <= c <= 300 for c in counts.values())  # spread near 250 each


def test_bad_input():
    log2phy, logcnt = torch.tensor([[0, 1]]), torch.tensor([2])
    with pytest.raises(ValueError, match="strategy='nope'"):
        route_to_replicas(torch.zeros(1, 1, dtype=torch.int64), log2phy, logcnt, strategy="nope")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="outside"):
        route_to_replicas(torch.tensor([[3]]), log2phy, logcnt)
    with pytest.raises(ValueError, match="integer"):
        route_to_replicas(torch.zeros(1, 1), log2phy, logcnt)
