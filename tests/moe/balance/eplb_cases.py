"""EPLB's published example, independent placement checks and random problems.

Shared by ``test_eplb``, ``test_incremental`` and ``tests/cli/test_ep_balance``.
"""

from __future__ import annotations

from collections import Counter

import torch
from hypothesis import strategies as st

# deepseek-ai/EPLB README: 2 layers, 12 experts, 16 replicas, 4 groups, 2 nodes, 8 GPUs
EPLB_WEIGHT = [
    [90, 132, 40, 61, 104, 165, 39, 4, 73, 56, 183, 86],
    [20, 107, 104, 64, 19, 197, 187, 157, 172, 86, 16, 27],
]
EPLB_PHY2LOG = [
    [5, 6, 5, 7, 8, 4, 3, 4, 10, 9, 10, 2, 0, 1, 11, 1],
    [7, 10, 6, 8, 6, 11, 8, 9, 2, 4, 5, 1, 5, 0, 3, 1],
]


def check_invariants(placement, weight, num_groups, num_nodes, num_gpus, hierarchical):
    """Independent checks of a placement: coverage, counts, GPU sizes, no duplicates, groups."""
    phy2log, log2phy, logcnt = placement
    num_layers, num_log = weight.shape
    num_replicas = phy2log.shape[1]
    per_gpu = num_replicas // num_gpus
    gpn = num_gpus // num_nodes
    for layer in range(num_layers):
        row = phy2log[layer].tolist()
        counts = Counter(row)
        assert all(counts[e] >= 1 for e in range(num_log)), "every expert has a replica"
        assert logcnt[layer].tolist() == [counts[e] for e in range(num_log)]
        assert int(logcnt[layer].sum()) == num_replicas
        for e in range(num_log):
            ids = [p for p in log2phy[layer, e].tolist() if p >= 0]
            assert sorted(ids) == [p for p, x in enumerate(row) if x == e]
            assert log2phy[layer, e].tolist()[len(ids) :] == [-1] * (log2phy.shape[2] - len(ids))
        gpus = [row[g * per_gpu : (g + 1) * per_gpu] for g in range(num_gpus)]
        assert all(len(gpu) == per_gpu for gpu in gpus)
        assert all(len(set(gpu)) == len(gpu) for gpu in gpus), "no GPU holds an expert twice"
        if hierarchical:
            group_size = num_log // num_groups
            node_of_group: dict[int, set[int]] = {}
            for g, gpu in enumerate(gpus):
                for e in gpu:
                    node_of_group.setdefault(e // group_size, set()).add(g // gpn)
            assert all(len(nodes) == 1 for nodes in node_of_group.values()), "group on one node"


@st.composite
def problems(draw):
    """``(weight [L, E] int64, num_replicas, num_groups, num_nodes, num_gpus)``: a problem
    that EPLB's hierarchical policy accepts (groups split evenly over nodes)."""
    num_nodes = draw(st.integers(1, 3))
    gpus_per_node = draw(st.integers(1, 4))
    groups_per_node = draw(st.integers(1, 3))
    group_size = draw(st.integers(1, 4))
    num_gpus = num_nodes * gpus_per_node
    num_groups = num_nodes * groups_per_node
    num_log = num_groups * group_size
    # replicas per GPU between ceil(E/G) and E/N (the most a GPU can hold without duplicates)
    lo = -(-num_log // num_gpus)
    per_gpu = draw(st.integers(lo, max(lo, num_log // num_nodes)))
    num_layers = draw(st.integers(1, 2))
    weight = draw(
        st.lists(
            st.lists(st.integers(0, 500), min_size=num_log, max_size=num_log),
            min_size=num_layers,
            max_size=num_layers,
        )
    )
    return torch.tensor(weight), per_gpu * num_gpus, num_groups, num_nodes, num_gpus
