"""Buffer(topology=Topology(ranks_per_node=P)) on 2 ranks (2 nodes x 1) and 4 ranks (2 nodes x 2): dispatch bit-equal to
the all-gather reference (no transport involved), combine equal to a sum in node order
computed from per-rank contributions, inter-node bytes = distinct (token, other node) pairs x
H x element size."""

from __future__ import annotations

import pytest
import torch

from nobubble.distributed import spawn
from nobubble.moe import Buffer, Topology
from tests.moe.reference import reference_combine, reference_dispatch


def _routing(kind: str, n: int, num_experts: int, topk: int, g: torch.Generator):
    scores = torch.rand(n, num_experts, generator=g)
    if kind == "skewed":  # experts of the upper half never chosen: empty experts
        scores[:, num_experts // 2 :] = -1.0
    idx = scores.topk(topk, dim=1).indices
    if kind == "holes":
        idx[torch.rand(idx.shape, generator=g) < 0.3] = -1
        idx[: max(1, n // 3)] = -1  # tokens with every slot -1
    return idx, torch.rand(n, topk, generator=g)


def _node_order_sum(y, ref, n, rank: int, world: int, ranks_per_node: int) -> torch.Tensor:
    """Expected combine: per source token, sum the ranks of each node in order, then nodes."""
    contrib = []
    for r in range(world):  # rank r's rows only; the others contribute exact zeros
        keep = 1.0 if rank == r else 0.0
        contrib.append(reference_combine(y * keep, ref.recv_src_rank, ref.recv_src_token, n))
    out = torch.zeros(n, y.shape[1])
    for node in range(world // ranks_per_node):
        partial = torch.zeros(n, y.shape[1])
        for q in range(ranks_per_node):
            partial = partial + contrib[node * ranks_per_node + q]
        out = out + partial
    return out


def _check(ctx, buf: Buffer, case) -> None:
    hier = buf.hierarchical
    assert hier is not None and buf.path == "hierarchical"
    name, tokens, hidden, num_experts, topk, kind, dtype = case
    p = hier.ranks_per_node
    g = torch.Generator().manual_seed(17 * ctx.rank + len(name))
    n = tokens[ctx.rank % len(tokens)]
    idx, w = _routing(kind, n, num_experts, topk, g)
    x = torch.randn(n, hidden, generator=g).to(dtype)
    hier.inter.reset_stats()
    res = buf.dispatch(x, idx, w, num_experts=num_experts)
    ref = reference_dispatch(x, idx, w, num_experts)
    assert torch.equal(res.recv_x, ref.recv_x), name
    assert torch.equal(res.recv_topk_idx, ref.recv_topk_idx), name
    assert torch.equal(res.recv_topk_weights, ref.recv_topk_weights), name
    assert res.num_recv_tokens_per_expert == ref.num_recv_tokens_per_expert, name

    in_rank = res.handle.is_token_in_rank.reshape(n, ctx.world_size // p, p)  # (N, D, P)
    other = torch.ones(in_rank.shape[1], dtype=torch.bool)
    other[ctx.rank // p] = False
    pairs = int(in_rank.any(dim=2)[:, other].sum())  # distinct (token, other node)
    inter_bytes = hier.inter.stats().bytes_sent_remote["x"]
    assert inter_bytes == pairs * hidden * x.element_size(), name
    assert hier.plan(res.handle).num_inter_node_rows == pairs
    flat_bytes = int(in_rank[:, other].sum()) * hidden * x.element_size()
    assert inter_bytes <= flat_bytes, name

    y = torch.randn(res.recv_x.shape, generator=g).to(dtype)
    comb = buf.combine(y, res.handle).combined_x
    flat = reference_combine(y, ref.recv_src_rank, ref.recv_src_token, n)
    if dtype == torch.float32:
        assert torch.equal(comb, _node_order_sum(y, ref, n, ctx.rank, ctx.world_size, p)), name
        torch.testing.assert_close(comb, flat, rtol=1e-6, atol=1e-6)
    else:  # the node partial is rounded to bf16 before it crosses: two bf16 roundings
        torch.testing.assert_close(comb.float(), flat.float(), rtol=2**-7, atol=2**-7)

    # autograd through the hierarchical movers; integer-valued gradients sum exactly
    xg = x.detach().float().requires_grad_()
    r2 = buf.dispatch(xg, idx, num_experts=num_experts)
    gy = torch.randint(-3, 4, r2.recv_x.shape, generator=g).float()
    (r2.recv_x * gy).sum().backward()
    want = reference_combine(gy, ref.recv_src_rank, ref.recv_src_token, n)
    assert torch.equal(xg.grad, want), name


CASES = [  # name, tokens by rank, hidden, experts, topk, routing, dtype
    ("random", (9, 4, 7, 5), 16, 8, 3, "random", torch.float32),
    ("zero-tokens-holes", (0, 6, 5, 8), 12, 8, 2, "holes", torch.float32),
    ("empty-experts-k8", (7, 3, 0, 6), 10, 16, 8, "skewed", torch.float32),
    ("bf16", (6, 8, 3, 5), 24, 8, 4, "random", torch.bfloat16),
]


def _run(ctx, ranks_per_node: int) -> dict:
    with Buffer(topology=Topology(ranks_per_node=ranks_per_node), timeout_s=60) as buf:
        for case in CASES:
            _check(ctx, buf, case)
    with pytest.raises(ValueError, match="ranks_per_node=3"):
        Buffer(topology=Topology(ranks_per_node=3))
    return {"rank": ctx.rank}


@pytest.mark.parametrize(("world_size", "ranks_per_node"), [(2, 1), (4, 2)])
def test_hierarchical_equals_reference(world_size, ranks_per_node):
    out = spawn(_run, world_size, args=(ranks_per_node,), timeout_s=240)
    assert [o["rank"] for o in out] == list(range(world_size))
