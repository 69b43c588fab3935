"""Buffer(topology=Topology(ranks_per_node=1)) with 4 nodes (4 ranks, 1 per node): a token whose experts live on three
remote nodes is sent over the rail to all three, and dispatch, combine and autograd equal the
all-gather reference bit for bit.

The routing is built so that on every rank token 0 goes to one expert on each of the three
other nodes and none on its own, and token 1 to two experts of one remote node (it crosses
once) and one of its own. The payload encodes its source (``x[n, h] = 1000 * rank + n +
h / 64``, exact in float32), so a received row tells where it came from. The counters the
buffer exposes (its plan's per-node rows, the rail transport's bytes) must show the
three-node fan-out.

With one rank per node the node partial of combine is a single row (rounding it to the
payload dtype is exact) and node order is rank order, so combine equals the flat reference
exactly, in bf16 as in float32 - tighter than the 2 x 2 test of ``test_hierarchical.py``.
"""

from __future__ import annotations

import torch

from nobubble.distributed import spawn
from nobubble.moe import Buffer, Topology
from nobubble.moe.fastpath.hierarchical import HierarchicalRows
from tests.moe.reference import reference_combine, reference_dispatch

NUM_NODES = 4  # = ranks: 1 rank per node
HIDDEN, NUM_EXPERTS, TOPK = 24, 16, 4
LOCAL = NUM_EXPERTS // NUM_NODES  # experts per node


def _expert_on(node: int, e: int) -> int:
    return node * LOCAL + e


def _routing(rank: int, n: int, g: torch.Generator) -> torch.Tensor:
    """Random top-k with holes, then the two constructed tokens (``[N, K]``)."""
    idx = torch.rand(n, NUM_EXPERTS, generator=g).topk(TOPK, dim=1).indices
    idx[torch.rand(idx.shape, generator=g) < 0.3] = -1
    others = [(rank + d) % NUM_NODES for d in (1, 2, 3)]
    if n > 0:  # one expert on each of the three remote nodes, none on its own
        idx[0] = torch.tensor(
            [_expert_on(others[0], 0), _expert_on(others[1], 1), _expert_on(others[2], 2), -1]
        )
    if n > 1:  # two experts of one remote node, one of its own
        idx[1] = torch.tensor(
            [_expert_on(others[0], 3), _expert_on(rank, 1), _expert_on(others[0], 1), -1]
        )
    return idx


def _encoded(rank: int, n: int) -> torch.Tensor:
    token = torch.arange(n, dtype=torch.float32).view(n, 1)
    return 1000.0 * rank + token + torch.arange(HIDDEN, dtype=torch.float32) / 64  # (N, H)


def _check(
    ctx, buf: Buffer, hier: HierarchicalRows, tokens: tuple[int, ...], dtype: torch.dtype
) -> dict:
    rank = ctx.rank
    n = tokens[rank]
    g = torch.Generator().manual_seed(31 * rank + len(tokens) + n)
    idx = _routing(rank, n, g)
    w = torch.rand(n, TOPK, generator=g)
    x = _encoded(rank, n) if dtype == torch.float32 else torch.randn(n, HIDDEN, generator=g)
    x = x.to(dtype)

    hier.inter.reset_stats()
    res = buf.dispatch(x, idx, w, num_experts=NUM_EXPERTS)
    ref = reference_dispatch(x, idx, w, NUM_EXPERTS)
    assert torch.equal(res.recv_x, ref.recv_x)
    assert torch.equal(res.recv_topk_idx, ref.recv_topk_idx)
    assert torch.equal(res.recv_topk_weights, ref.recv_topk_weights)
    assert res.num_recv_tokens_per_expert == ref.num_recv_tokens_per_expert

    # the fan-out, from the buffer's own counters
    plan = hier.plan(res.handle)
    in_node = res.handle.is_token_in_rank  # (N, D): one rank per node
    remote = in_node.clone()
    remote[:, hier.node] = False
    pairs = int(remote.sum())  # distinct (token, other node)
    assert plan.num_inter_node_rows == pairs
    assert hier.inter.stats().bytes_sent_remote.get("x", 0) == pairs * HIDDEN * x.element_size()
    off = [0]
    for c in plan.send1_counts:
        off.append(off[-1] + c)
    fanout = 0
    if n > 0:
        to_nodes = [
            d for d in range(NUM_NODES) if 0 in plan.send1_token[off[d] : off[d + 1]].tolist()
        ]
        assert to_nodes == sorted((rank + d) % NUM_NODES for d in (1, 2, 3)), to_nodes
        fanout = len(to_nodes)
    if n > 1:  # two experts on one remote node: one row, not two
        node = (rank + 1) % NUM_NODES
        assert plan.send1_token[off[node] : off[node + 1]].tolist().count(1) == 1
    # every other rank's token 0 arrived here, intact
    src = res.handle.recv_rank_offsets
    for s in range(NUM_NODES):
        got = res.handle.recv_src_idx[src[s] : src[s + 1]].tolist()
        assert (0 in got) == (s != rank and tokens[s] > 0), (s, got)
        if dtype == torch.float32 and s != rank and tokens[s] > 0:
            assert torch.equal(res.recv_x[src[s] + got.index(0)], _encoded(s, 1)[0].to(dtype))

    # combine: node order = rank order and one-row node partials -> exactly the reference
    y = (res.recv_x.float() * 1.5 + torch.randn(res.recv_x.shape, generator=g)).to(dtype)
    comb = buf.combine(y, res.handle, topk_weights=res.recv_topk_weights)
    args = (ref.recv_src_rank, ref.recv_src_token, n)
    assert torch.equal(comb.combined_x, reference_combine(y, *args))
    assert torch.equal(comb.combined_topk_weights, reference_combine(ref.recv_topk_weights, *args))

    # autograd through both hierarchical movers
    xg, wg = x.detach().clone().requires_grad_(), w.clone().requires_grad_()
    r2 = buf.dispatch(xg, idx, wg, num_experts=NUM_EXPERTS)
    gy = torch.randn(r2.recv_x.shape, generator=g).to(dtype)
    gw = torch.randn(r2.recv_topk_weights.shape, generator=g)
    ((r2.recv_x.float() * gy.float()).sum() + (r2.recv_topk_weights * gw).sum()).backward()
    assert xg.grad is not None and wg.grad is not None
    assert torch.equal(xg.grad, reference_combine(gy, *args))
    assert torch.equal(wg.grad, reference_combine(gw * (ref.recv_topk_idx >= 0), *args))
    yg = y.detach().clone().requires_grad_()
    out = buf.combine(yg, res.handle).combined_x
    gc = torch.randn(out.shape, generator=g).to(dtype)
    (out.float() * gc.float()).sum().backward()
    want = reference_dispatch(gc, idx, None, NUM_EXPERTS).recv_x
    assert torch.equal(yg.grad, want)
    return {"fanout": fanout, "pairs": pairs}


CASES = [  # tokens by rank, dtype
    ((7, 5, 9, 4), torch.float32),
    ((6, 0, 8, 3), torch.float32),  # a rank with no tokens (it still forwards and combines)
    ((5, 7, 4, 6), torch.bfloat16),
]


def _run(ctx) -> list[dict]:
    with Buffer(topology=Topology(ranks_per_node=1), timeout_s=60) as buf:
        hier = buf.hierarchical
        assert hier is not None and (hier.num_nodes, hier.node) == (NUM_NODES, ctx.rank)
        out = [_check(ctx, buf, hier, tokens, dtype) for tokens, dtype in CASES]
    return out


def test_four_nodes_fan_out_and_equal_the_reference():
    results = spawn(_run, NUM_NODES, timeout_s=120)
    for c, (tokens, _) in enumerate(CASES):
        for rank in range(NUM_NODES):
            assert results[rank][c]["fanout"] == (3 if tokens[rank] else 0), (c, rank)
        assert sum(r[c]["pairs"] for r in results) >= 3 * sum(t > 0 for t in tokens)
