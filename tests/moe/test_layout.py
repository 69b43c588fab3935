"""get_dispatch_layout against a plain-Python recomputation, plus its input checks."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from nobubble.moe.layout import get_dispatch_layout


def _loop_layout(topk_idx: torch.Tensor, num_experts: int, num_ranks: int):
    """Obviously-correct layout: walk every token and slot."""
    per_rank = num_experts // num_ranks
    n = topk_idx.shape[0]
    in_rank = [[False] * num_ranks for _ in range(n)]
    per_expert = [0] * num_experts
    for t, row in enumerate(topk_idx.tolist()):
        for e in row:
            if e >= 0:
                in_rank[t][e // per_rank] = True
                per_expert[e] += 1
    per_rank_count = [sum(in_rank[t][r] for t in range(n)) for r in range(num_ranks)]
    return per_rank_count, per_expert, in_rank


@st.composite
def routing(draw):
    num_ranks = draw(st.integers(1, 5))
    num_experts = num_ranks * draw(st.integers(1, 6))
    topk = draw(st.integers(1, min(num_experts, 8)))
    num_tokens = draw(st.integers(0, 12))
    rows = []
    for _ in range(num_tokens):
        experts = draw(st.permutations(range(num_experts)))[:topk]
        empty = draw(st.lists(st.booleans(), min_size=topk, max_size=topk))
        rows.append([-1 if drop else e for e, drop in zip(experts, empty)])
    idx = torch.tensor(rows, dtype=torch.int64).reshape(num_tokens, topk)
    return idx, num_experts, num_ranks


@settings(max_examples=150, deadline=None)
@given(routing())
def test_layout_matches_loop(case):
    topk_idx, num_experts, num_ranks = case
    layout = get_dispatch_layout(topk_idx, num_experts, num_ranks)
    per_rank, per_expert, in_rank = _loop_layout(topk_idx, num_experts, num_ranks)
    assert layout.num_tokens_per_rank.tolist() == per_rank
    assert layout.num_tokens_per_expert.tolist() == per_expert
    assert layout.is_token_in_rank.tolist() == in_rank
    assert layout.is_token_in_rank.dtype == torch.bool
    assert layout.num_tokens_per_rank.dtype == torch.int64


def test_duplicate_rank_counted_once():
    # experts 0 and 1 both live on rank 0 (4 experts, 2 ranks): one token, sent once
    layout = get_dispatch_layout(torch.tensor([[0, 1, 3]]), 4, 2)
    assert layout.num_tokens_per_rank.tolist() == [1, 1]
    assert layout.num_tokens_per_expert.tolist() == [1, 1, 0, 1]


def test_all_empty_slots_go_nowhere():
    layout = get_dispatch_layout(torch.full((3, 2), -1), 4, 2)
    assert layout.num_tokens_per_rank.tolist() == [0, 0]
    assert not layout.is_token_in_rank.any()


@pytest.mark.parametrize(
    ("topk_idx", "num_experts", "num_ranks", "needle"),
    [
        (torch.tensor([[0, 1]]), 6, 4, "num_experts=6"),
        (torch.tensor([[0, 8]]), 8, 2, "expert id 8"),
        (torch.tensor([[0, -2]]), 8, 2, "expert id -2"),
        (torch.tensor([[0.0, 1.0]]), 8, 2, "dtype"),
        (torch.tensor([0, 1]), 8, 2, "shape"),
        (torch.tensor([[0, 1]]), 8, 0, "num_ranks=0"),
    ],
)
def test_bad_input_raises(topk_idx, num_experts, num_ranks, needle):
    with pytest.raises(ValueError, match=needle):
        get_dispatch_layout(topk_idx, num_experts, num_ranks)
