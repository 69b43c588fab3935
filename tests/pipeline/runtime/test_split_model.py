"""``split_model``: the one way to cut a model into stages, against brute force.

Reference: every contiguous cut, enumerated as its ``num_stages - 1`` cut points
(``itertools.combinations``), each scored by its most costly stage; the least such score is
the min-max answer. It shares no code with the DP in :mod:`nobubble.pipeline.partition`.
"""

from __future__ import annotations

import itertools
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from nobubble.pipeline.partition import equal_sizes, stage_sizes
from nobubble.pipeline.plan import BlockCosts, plan_from_costs
from nobubble.pipeline.runtime.runner import split_model

WIDTH, VOCAB = 512, 1000


def least_bottleneck(costs: list[float], num_stages: int) -> float:
    """Brute force: the least, over every contiguous cut, of its most costly stage."""
    n, best = len(costs), math.inf
    for cuts in itertools.combinations(range(1, n), num_stages - 1):
        bounds = (0, *cuts, n)
        best = min(best, max(sum(costs[a:b]) for a, b in itertools.pairwise(bounds)))
    return best


def held(parts: list[nn.Module], blocks: list[nn.Module], costs: list[float]) -> list[float]:
    """Each stage's cost, found by the identity of the blocks it holds."""
    index = {id(b): i for i, b in enumerate(blocks)}
    return [sum(costs[index[id(m)]] for m in part) for part in parts]


def num_params(block: nn.Module) -> float:
    return float(sum(p.numel() for p in block.parameters()))


def transformer() -> list[nn.Module]:
    """torch's own modules: an embedding, four encoder layers of width 512, a head."""
    layers = [nn.TransformerEncoderLayer(WIDTH, 8, 4 * WIDTH) for _ in range(4)]
    return [nn.Embedding(VOCAB, WIDTH), *layers, nn.Linear(WIDTH, VOCAB)]


def test_params_is_the_least_bottleneck_cut_of_a_transformer() -> None:
    blocks = transformer()
    params = [num_params(b) for b in blocks]
    attention, feed_forward, norms = 4 * WIDTH**2 + 4 * WIDTH, 8 * WIDTH**2 + 5 * WIDTH, 4 * WIDTH
    assert params[1] == attention + feed_forward + norms  # 3,152,384 per layer
    for num_stages in range(1, len(blocks) + 1):
        parts = split_model(blocks, num_stages, balance="params")
        assert max(held(parts, blocks, params)) == least_bottleneck(params, num_stages)
    # two stages: two layers each (the running-total rule put three layers on stage 0);
    # four: the embedding and the head each share a stage with one layer
    assert [len(p) for p in split_model(blocks, 2, balance="params")] == [3, 3]
    assert [len(p) for p in split_model(blocks, 4, balance="params")] == [2, 1, 1, 2]


@settings(max_examples=200, deadline=None)
@given(
    costs=st.lists(st.integers(0, 20), min_size=1, max_size=10),
    data=st.data(),
)
def test_costs_give_the_brute_force_min_max(costs: list[int], data) -> None:
    num_stages = data.draw(st.integers(1, min(4, len(costs))))
    blocks = [nn.Identity() for _ in costs]
    parts = split_model(blocks, num_stages, balance=[float(c) for c in costs])
    assert len(parts) == num_stages and min(len(p) for p in parts) >= 1
    assert [m for p in parts for m in p] == blocks  # every block once, in order
    assert max(held(parts, blocks, costs)) == least_bottleneck(costs, num_stages)


@settings(max_examples=50, deadline=None)
@given(widths=st.lists(st.integers(0, 6), min_size=1, max_size=8), data=st.data())
def test_params_give_the_brute_force_min_max(widths: list[int], data) -> None:
    num_stages = data.draw(st.integers(1, min(4, len(widths))))
    # width 0: a block without parameters (weighs 0)
    blocks = [nn.Linear(w, w) if w else nn.ReLU() for w in widths]
    params = [num_params(b) for b in blocks]
    parts = split_model(nn.Sequential(*blocks), num_stages, balance="params")
    assert max(held(parts, blocks, params)) == least_bottleneck(params, num_stages)


def test_no_balance_is_equal_counts_and_the_stages_hold_the_users_modules() -> None:
    blocks = transformer()
    parts = split_model(nn.Sequential(*blocks), 4)
    assert [len(p) for p in parts] == [2, 2, 1, 1] == list(equal_sizes(6, 4))
    assert all(m is b for m, b in zip((m for p in parts for m in p), blocks, strict=True))


def block(ms: float) -> BlockCosts:
    return BlockCosts(ms, ms, ms, activation_bytes=100.0, boundary_bytes=10.0)


def test_a_plan_as_balance_gives_its_stage_sizes() -> None:
    costs = [5.0, 5.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0]  # not the equal cut: (2, 6)
    plan = plan_from_costs([block(c) for c in costs], num_ranks=2, num_microbatches=4,
                           schedules=["1f1b", "zb-h1"], recompute=False)  # fmt: skip
    sizes = plan.stage_sizes()
    assert sizes == (2, 6) != equal_sizes(len(costs), len(sizes))
    blocks = [nn.Identity() for _ in costs]
    parts = split_model(blocks, len(sizes), balance=plan)
    assert tuple(len(p) for p in parts) == sizes
    assert [m for p in parts for m in p] == blocks and parts[0][0] is blocks[0]
    with pytest.raises(ValueError, match=r"2 stages, not 8 into num_stages=3.*num_stages=2"):
        split_model(blocks, 3, balance=plan)
    with pytest.raises(ValueError, match=r"the plan cuts 8 blocks.*not 7.*the blocks it planned"):
        split_model(blocks[:7], 2, balance=plan)


@pytest.mark.parametrize(
    ("num_stages", "balance", "message"),
    [
        (3, None, r"num_stages=3 for 2 blocks; use 1\.\.2"),
        (0, "params", r"num_stages=0 for 2 blocks; use 1\.\.2"),
        (1, "flops", r"balance='flops'; use None, 'params', a Plan or one cost per block"),
        (1, 3, r"balance=3; use None, 'params', a Plan or one cost per block"),
        (1, [1.0], r"1 costs for 2 blocks; give one cost per block"),
        (2, [1.0, math.nan], r"block 1's cost is nan; every cost must be finite and >= 0"),
        (2, [-1.0, 1.0], r"block 0's cost is -1.0; every cost must be finite and >= 0"),
        (2, [1.0, math.inf], r"block 1's cost is inf"),
    ],
)
def test_bad_input_is_refused_with_the_value_and_the_fix(num_stages, balance, message) -> None:
    with pytest.raises(ValueError, match=message):
        split_model([nn.ReLU(), nn.ReLU()], num_stages, balance=balance)


def test_stage_sizes_is_pure_and_equal_when_every_cost_is_zero() -> None:
    assert stage_sizes(7, 3) == equal_sizes(7, 3) == (3, 2, 2)
    assert stage_sizes(5, 2, [0.0] * 5) == (3, 2)  # every cut is as good: the equal one
    assert stage_sizes(4, 2, [0.0, 3.0, 3.0, 0.0]) == (2, 2)  # zero costs: exact still


def test_the_elastic_replan_cuts_with_the_planners_dp() -> None:
    from nobubble.pipeline import partition
    from nobubble.pipeline.runtime.elastic import partition as elastic_partition
    from nobubble.pipeline.runtime.elastic import replanning

    assert elastic_partition.balanced_sizes is partition.balanced_sizes
    assert replanning.balanced_sizes is partition.balanced_sizes
