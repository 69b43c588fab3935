"""Prioritized replay: chi-square test of sampling frequencies, IS weights, updates, sum tree."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from nobubble.rl.algo.replay import PrioritizedReplayBuffer, SegmentTree, linear_beta

# Upper 0.1% point of the chi-square distribution with 15 degrees of freedom: 37.697.
# Source: NIST/SEMATECH e-Handbook of Statistical Methods, section 1.3.6.7.4, "Critical
# Values of the Chi-Square Distribution" (row nu = 15, column 0.999). Cross-checked below.
CHI2_CRIT_DF15_P999 = 37.697


def _chi2_cdf(x: float, dof: int) -> float:
    """Regularized lower incomplete gamma P(dof/2, x/2) by its power series."""
    s, z = dof / 2, x / 2
    term = total = 1.0 / s
    n = 1
    while term > 1e-16 * total:
        term *= z / (s + n)
        total += term
        n += 1
    return math.exp(s * math.log(z) - z - math.lgamma(s)) * total


def test_critical_value_is_the_999_quantile() -> None:
    assert _chi2_cdf(CHI2_CRIT_DF15_P999, 15) == pytest.approx(0.999, abs=2e-6)


def _chi2(counts: np.ndarray, probs: np.ndarray) -> float:
    expected = counts.sum() * probs
    return float(((counts - expected) ** 2 / expected).sum())


PRIORITIES = np.array(
    [0.1, 0.5, 1.0, 2.0, 3.0, 0.2, 0.7, 5.0, 1.5, 0.05, 4.0, 0.9, 2.5, 0.3, 1.2, 0.6]
)


def test_sampling_frequencies_match_priorities_pow_alpha() -> None:
    alpha, eps = 0.7, 1e-6
    buf = PrioritizedReplayBuffer(16, alpha=alpha, eps=eps, seed=1234)
    buf.extend(list(range(16)), PRIORITIES)
    draws = np.concatenate([buf.sample(4096).indices for _ in range(25)])  # 102,400 draws
    counts = np.bincount(draws, minlength=16)
    p_alpha = (PRIORITIES + eps) ** alpha
    assert _chi2(counts, p_alpha / p_alpha.sum()) < CHI2_CRIT_DF15_P999
    # The test has power: the same counts are rejected against alpha = 1 or uniform.
    assert _chi2(counts, PRIORITIES / PRIORITIES.sum()) > 10 * CHI2_CRIT_DF15_P999
    assert _chi2(counts, np.full(16, 1 / 16)) > 10 * CHI2_CRIT_DF15_P999


def test_is_weights_match_formula() -> None:
    alpha, beta, eps = 0.6, 0.4, 1e-6
    buf = PrioritizedReplayBuffer(8, alpha=alpha, beta=beta, eps=eps, seed=0)
    pr = [1.0, 2.0, 0.5, 4.0, 3.0]
    buf.extend(list("abcde"), pr)
    s = buf.sample(64)
    n = len(pr)
    p = [(x + eps) ** alpha for x in pr]
    P = [x / sum(p) for x in p]
    raw = [(n * q) ** -beta for q in P]
    for slot, item, w, prob in zip(s.indices, s.items, s.weights.tolist(), s.probabilities):
        assert item == "abcde"[slot]
        assert prob == pytest.approx(P[slot])
        assert w == pytest.approx(raw[slot] / max(raw), rel=1e-6)
    assert s.weights.dtype == torch.float32 and s.weights.max().item() <= 1.0
    full = buf.sample(64, beta=1.0)
    assert full.weights.tolist() == pytest.approx([min(P) / P[i] for i in full.indices], rel=1e-6)


def _probabilities(buf: PrioritizedReplayBuffer) -> np.ndarray:
    """``P(i)`` of slots ``0 .. len(buf) - 1``, read off a draw of every item."""
    s = buf.sample(len(buf), replace=False)
    return s.probabilities[np.argsort(s.indices)]


def test_updates_change_probabilities_and_frequencies() -> None:
    buf = PrioritizedReplayBuffer(4, alpha=1.0, eps=1e-6, seed=7)
    buf.extend(["w", "x", "y", "z"], [1.0, 1.0, 1.0, 1.0])
    assert _probabilities(buf).tolist() == pytest.approx([0.25] * 4)
    buf.update_priorities([2], torch.tensor([7.0]))
    assert _probabilities(buf).tolist() == pytest.approx([0.1, 0.1, 0.7, 0.1], rel=1e-5)
    draws = np.concatenate([buf.sample(1000).indices for _ in range(10)])
    assert np.mean(draws == 2) == pytest.approx(0.7, abs=0.02)
    # An item with priority 0 is still reachable (eps) but only barely.
    buf.update_priorities([0, 1, 3], [0.0, 0.0, 0.0])
    assert _probabilities(buf)[2] > 0.999999


def test_new_items_get_max_priority_and_ring_overwrites_oldest() -> None:
    buf = PrioritizedReplayBuffer(3, alpha=1.0, eps=1e-9, seed=0)
    buf.extend(["a"], [4.0])
    buf.extend(["b"])  # max priority seen so far: 4
    assert _probabilities(buf).tolist() == pytest.approx([0.5, 0.5])
    buf.extend(["c", "d"], [1.0, 1.0])  # "d" overwrites slot 0 ("a")
    assert len(buf) == 3
    s = buf.sample(500)
    assert set(s.items) == {"b", "c", "d"}
    assert all(item == "dbc"[slot] for slot, item in zip(s.indices.tolist(), s.items))
    assert _probabilities(buf).tolist() == pytest.approx([1 / 6, 4 / 6, 1 / 6])
    buf.clear()
    assert len(buf) == 0
    with pytest.raises(ValueError, match="empty"):
        buf.sample(1)
    # slots and max priority start over
    assert buf.extend(["e"], [1.0]).tolist() == [0] and buf.extend(["f"]).tolist() == [1]
    assert _probabilities(buf).tolist() == pytest.approx([0.5, 0.5])
    with pytest.raises(ValueError, match="empty"):
        PrioritizedReplayBuffer(3).sample(1)


@settings(max_examples=80, deadline=None)
@given(
    st.integers(1, 40),
    st.lists(
        st.tuples(st.integers(0, 39), st.one_of(st.just(0.0), st.floats(1e-6, 100.0))),
        min_size=1,
        max_size=60,
    ),
    st.integers(0, 2**31 - 1),
    st.sampled_from([2, 3, 32]),
)
def test_sum_tree_matches_prefix_sums(capacity, updates, seed, fanout) -> None:
    tree, mins = SegmentTree(capacity, fanout=fanout), SegmentTree(capacity, np.minimum, fanout)
    leaves = np.zeros(capacity)
    set_leaves = np.full(capacity, np.inf)  # the min tree's empty leaves are +inf
    for i, v in updates:
        i %= capacity
        tree.update([i], [v])
        mins.update([i], [v])
        leaves[i] = set_leaves[i] = v
    assert tree.root() == pytest.approx(leaves.sum())
    assert mins.root() == set_leaves.min()
    if leaves.sum() > 0:
        mass = np.random.default_rng(seed).random(200) * leaves.sum()
        expect = np.searchsorted(np.cumsum(leaves), mass, side="right")
        assert tree.find_prefix(mass).tolist() == expect.tolist()


def test_linear_beta_anneals_to_one() -> None:
    assert (
        linear_beta(0, 10) == 0.4
        and linear_beta(5, 10) == pytest.approx(0.7)
        and linear_beta(99, 10) == 1.0
    )


def test_bad_input() -> None:
    with pytest.raises(ValueError, match="alpha=1.5"):
        PrioritizedReplayBuffer(4, alpha=1.5)
    with pytest.raises(ValueError, match="capacity=0"):
        PrioritizedReplayBuffer(0)
    buf = PrioritizedReplayBuffer(4)
    with pytest.raises(ValueError, match=">= 0"):
        buf.extend(["x"], [-1.0])
    buf.extend(["x"], [1.0])
    with pytest.raises(ValueError, match=r"slots must be in \[0, 1\)"):
        buf.update_priorities([3], [1.0])
    with pytest.raises(ValueError, match="beta=2"):
        buf.sample(1, beta=2)


@pytest.mark.parametrize("fanout", [2, 4, 32])
def test_mass_at_the_total_lands_on_the_last_nonempty_leaf(fanout) -> None:
    # A draw of mass == total (float rounding of u * total) must not reach an empty slot.
    tree = SegmentTree(10, fanout=fanout)
    tree.update([0, 1, 5], [1.0, 2.0, 0.5])
    assert tree.find_prefix([3.5, 3.4999, 0.0, 1.0]).tolist() == [5, 5, 0, 1]


def test_extend_beyond_capacity_keeps_the_newest() -> None:
    buf = PrioritizedReplayBuffer(3, alpha=1.0, eps=1e-9, seed=0)
    buf.extend(["old"], [1.0])
    buf.extend(["a", "b", "c", "d"], [1.0, 2.0, 3.0, 4.0])
    s = buf.sample(300)
    assert set(s.items) == {"b", "c", "d"}
    by_item = dict(zip(s.items, s.probabilities))
    assert [by_item[k] for k in "bcd"] == pytest.approx([2 / 9, 3 / 9, 4 / 9])


# -- sampling among eligible items -----------------------------------------------------------
def _reference_eligible(priorities, keep, alpha, beta, eps):
    """P_E and the IS weights written out item by item, over the eligible set only."""
    scores = {i: (p + eps) ** alpha for i, p in enumerate(priorities) if keep[i]}
    total = math.fsum(scores.values())
    prob = {i: s / total for i, s in scores.items()}
    n = len(prob)
    raw = {i: (n * q) ** -beta for i, q in prob.items()}
    top = max(raw.values())
    return prob, {i: r / top for i, r in raw.items()}


@settings(max_examples=120, deadline=None)
@given(
    st.lists(st.tuples(st.floats(0.0, 50.0), st.booleans()), min_size=1, max_size=24),
    st.floats(0.0, 1.0),
    st.floats(0.0, 1.0),
    st.integers(1, 30),
    st.booleans(),
    st.integers(0, 2**31 - 1),
)
def test_eligible_draws_follow_the_formula_over_the_eligible_set(
    entries, alpha, beta, batch_size, replace, seed
) -> None:
    priorities = [p for p, _ in entries]
    keep = [k for _, k in entries]
    buf = PrioritizedReplayBuffer(len(entries), alpha=alpha, beta=beta, eps=1e-3, seed=seed)
    buf.extend([(i, k) for i, k in enumerate(keep)], priorities)
    s = buf.sample(batch_size, eligible=lambda item: item[1], replace=replace)
    if not any(keep):
        assert s.indices.size == 0 and s.items == [] and s.weights.numel() == 0
        return
    prob, weight = _reference_eligible(priorities, keep, alpha, beta, 1e-3)
    slots = s.indices.tolist()
    assert len(slots) == (batch_size if replace else min(batch_size, sum(keep)))
    assert replace or len(set(slots)) == len(slots)  # distinct without replacement
    assert all(keep[i] and item == (i, True) for i, item in zip(slots, s.items))
    assert s.probabilities.tolist() == pytest.approx([prob[i] for i in slots], rel=1e-9)
    assert s.weights.tolist() == pytest.approx([weight[i] for i in slots], rel=1e-5)


def test_eligible_pairs_without_replacement_match_brute_force_enumeration() -> None:
    """Ordered pairs drawn from 4 eligible of 6 items against every pair's probability,
    enumerated: P(a, b) = P(a) * P(b) / (1 - P(a)) (successive sampling)."""
    pr = [3.0, 1.0, 9.0, 0.5, 2.0, 6.0]
    keep = [True, True, False, True, True, False]
    buf = PrioritizedReplayBuffer(6, alpha=1.0, eps=1e-9, seed=3)
    buf.extend(list(range(6)), pr)
    live = [i for i in range(6) if keep[i]]
    total = sum(pr[i] for i in live)
    pairs = [(a, b) for a in live for b in live if a != b]  # 12 ordered pairs, df = 11
    expect = np.array([pr[a] / total * pr[b] / (total - pr[a]) for a, b in pairs])
    counts = dict.fromkeys(pairs, 0)
    for _ in range(20_000):
        a, b = buf.sample(2, eligible=lambda i: keep[i], replace=False).indices.tolist()
        counts[(a, b)] += 1
    observed = np.array([counts[p] for p in pairs])
    # Upper 0.1% point of chi-square with 11 degrees of freedom (same NIST table): 31.264.
    assert _chi2_cdf(31.264, 11) == pytest.approx(0.999, abs=2e-6)
    assert _chi2(observed, expect) < 31.264
    # with replacement draws among them can repeat an item; the ineligible never appear
    s = buf.sample(400, eligible=lambda i: keep[i])
    assert set(s.indices.tolist()) == set(live)


def test_the_buffer_pickles_without_its_lock_and_draws_on() -> None:
    import pickle

    buf = PrioritizedReplayBuffer(8, alpha=0.7, seed=5)
    buf.extend(list("abcdef"), [1.0, 2.0, 3.0, 0.5, 0.1, 4.0])
    copy = pickle.loads(pickle.dumps(buf))
    assert copy.sample(16).indices.tolist() == buf.sample(16).indices.tolist()  # RNG too
    copy.extend(["g"], [9.0])  # the new lock works
    assert len(copy) == 7 and len(buf) == 6
