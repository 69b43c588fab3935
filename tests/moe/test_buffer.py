"""Buffer.dispatch / combine on 1, 2 and 4 gloo ranks against the all-gather reference.

The reference (``tests/moe/reference.py``) uses plain ``torch.distributed.all_gather`` and
never the buffer's transport, so a bug in ``Transport.all_to_all`` fails these checks too.

All checks for one world size run inside one spawn (process start-up dominates the cost).
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.distributed as dist

from nobubble.distributed import spawn
from nobubble.moe import Buffer
from nobubble.moe.baseline import pair_dispatch
from nobubble.moe.layout import get_dispatch_layout
from nobubble.moe.routing import deepseek_v3_topk
from tests.moe.reference import reference_combine, reference_dispatch

# name, hidden, num_experts, topk, tokens by rank (cycled), dtype, routing
CASES = [
    ("fp32-basic", 16, 8, 2, (6, 5, 7, 4), torch.float32, "random"),
    ("zero-tokens-holes", 12, 8, 3, (0, 6, 3, 5), torch.float32, "holes"),
    ("k1-odd-hidden", 7, 4, 1, (5, 3), torch.float32, "random"),
    ("k8-idle-experts", 10, 16, 8, (9, 4, 6, 2), torch.float32, "skewed"),
    ("bf16-deepseek-v3", 56, 32, 8, (16, 12), torch.bfloat16, "deepseek_v3"),
]


def _routing(kind: str, num_tokens: int, num_experts: int, topk: int, g: torch.Generator):
    scores = torch.rand(num_tokens, num_experts, generator=g)
    if kind == "deepseek_v3":  # 8 groups, 4 eligible: DeepSeek-V3's 256/8/4 scaled down
        r = deepseek_v3_topk(
            torch.randn(num_tokens, num_experts, generator=g), topk, n_groups=8, topk_groups=4
        )
        return r.topk_idx, r.topk_weights
    if kind == "skewed":  # only the first half of the experts is ever chosen
        scores[:, num_experts // 2 :] = -1.0
    idx = scores.topk(topk, dim=1).indices
    if kind == "holes":
        idx[torch.rand(idx.shape, generator=g) < 0.3] = -1
        if num_tokens:
            idx[0] = -1  # a token that goes nowhere
    return idx, torch.rand(num_tokens, topk, generator=g)


def _global_sum(t: torch.Tensor) -> torch.Tensor:
    t = t.clone()
    dist.all_reduce(t)
    return t


def _check_case(ctx, buf: Buffer, case_index: int) -> None:
    name, hidden, num_experts, topk, tokens, dtype, kind = CASES[case_index]
    rank, num_ranks = ctx.rank, ctx.world_size
    local = num_experts // num_ranks
    n = tokens[rank % len(tokens)]
    g = torch.Generator().manual_seed(1000 * rank + case_index)
    topk_idx, topk_weights = _routing(kind, n, num_experts, topk, g)
    layout = get_dispatch_layout(topk_idx, num_experts, num_ranks)
    in_rank = layout.is_token_in_rank

    # rank-encoded payload: every received segment must hold its source rank
    x = torch.ones(n, hidden, dtype=dtype) * rank
    w = torch.ones(n, topk) * rank
    buf.transport.reset_stats()
    res = buf.dispatch(x, topk_idx, w, num_experts=num_experts)
    sent = buf.transport.stats().bytes_sent["x"]
    assert sent == int(in_rank.sum()) * hidden * x.element_size(), (name, sent)
    recv_rows = _global_sum(layout.num_tokens_per_rank)[rank].item()
    assert res.recv_x.shape == (recv_rows, hidden), name
    expert_counts = _global_sum(layout.num_tokens_per_expert).view(num_ranks, local)[rank]
    assert res.num_recv_tokens_per_expert == expert_counts.tolist(), name
    offsets = res.handle.recv_rank_offsets
    for src in range(num_ranks):
        seg = slice(offsets[src], offsets[src + 1])
        assert (res.recv_x[seg].float() == src).all(), (name, src)
        idx_seg, w_seg = res.recv_topk_idx[seg], res.recv_topk_weights[seg]
        assert (w_seg[idx_seg >= 0] == src).all() and (w_seg[idx_seg < 0] == 0).all(), name
    assert ((res.recv_topk_idx >= -1) & (res.recv_topk_idx < local)).all(), name
    for e, count in enumerate(res.num_recv_tokens_per_expert):
        assert int((res.recv_topk_idx == e).sum()) == count, name
    comb = buf.combine(res.recv_x, res.handle, topk_weights=res.recv_topk_weights)
    copies = in_rank.sum(dim=1, keepdim=True)  # (N, 1)
    reached = copies.squeeze(1) > 0
    assert torch.equal((comb.combined_x.float() / copies)[reached], x.float()[reached]), name
    assert (comb.combined_x[~reached] == 0).all(), name
    assert torch.equal(comb.combined_topk_weights[reached], (w * (topk_idx >= 0))[reached]), name

    # random payload: bit-equal to the reference
    x = torch.randn(n, hidden, generator=g).to(dtype)
    res = buf.dispatch(x, topk_idx, topk_weights, num_experts=num_experts)
    ref = reference_dispatch(x, topk_idx, topk_weights, num_experts)
    assert torch.equal(res.recv_x, ref.recv_x), name
    assert torch.equal(res.recv_topk_idx, ref.recv_topk_idx), name
    assert torch.equal(res.recv_topk_weights, ref.recv_topk_weights), name
    assert res.num_recv_tokens_per_expert == ref.num_recv_tokens_per_expert, name
    assert torch.equal(res.handle.recv_src_idx, ref.recv_src_token), name
    per_source = torch.tensor(res.handle.num_recv_tokens_per_rank)  # (R,)
    assert torch.equal(torch.arange(num_ranks).repeat_interleave(per_source), ref.recv_src_rank)
    y = (res.recv_x.float() * 1.5 + torch.randn(res.recv_x.shape, generator=g)).to(dtype)
    comb = buf.combine(y, res.handle, topk_weights=res.recv_topk_weights)
    ref_y = reference_combine(y, ref.recv_src_rank, ref.recv_src_token, n)
    ref_w = reference_combine(ref.recv_topk_weights, ref.recv_src_rank, ref.recv_src_token, n)
    if dtype == torch.float32:
        assert torch.equal(comb.combined_x, ref_y), name
    else:  # within bf16 rounding of the float32 sum
        torch.testing.assert_close(comb.combined_x, ref_y, rtol=2**-8, atol=0)
    assert torch.equal(comb.combined_topk_weights, ref_w), name
    b1, b2 = (
        torch.randn(n, hidden, generator=g).to(dtype),
        torch.randn(n, hidden, generator=g).to(dtype),
    )
    with_bias = buf.combine(y, res.handle, bias=(b1, b2)).combined_x
    assert torch.equal(with_bias, comb.combined_x + b1 + b2), name

    # cached dispatch: the handle's layout, no count exchange
    x2 = torch.randn(n, hidden, generator=g).to(dtype)
    buf.transport.reset_stats()
    cached = buf.dispatch(x2, handle=res.handle)
    assert "layout" not in buf.transport.stats().calls, name
    assert torch.equal(cached.recv_x, reference_dispatch(x2, topk_idx, None, num_experts).recv_x)

    # per-pair baseline moves one copy per valid slot
    buf.transport.reset_stats()
    pair_dispatch(x, topk_idx, None, num_experts, buf.transport)
    assert (
        buf.transport.stats().bytes_sent["x"]
        == int((topk_idx >= 0).sum()) * hidden * x.element_size()
    )

    # load statistics and alignment
    stats = torch.zeros(local, dtype=torch.int64)
    for _ in range(2):
        aligned = buf.dispatch(
            x,
            topk_idx,
            num_experts=num_experts,
            expert_alignment=4,
            cumulative_local_expert_recv_stats=stats,
        ).num_recv_tokens_per_expert
    assert stats.tolist() == [2 * c for c in res.num_recv_tokens_per_expert], name
    assert aligned == [math.ceil(c / 4) * 4 for c in res.num_recv_tokens_per_expert], name

    if dtype == torch.float32:
        _check_autograd(buf, name, x, topk_idx, topk_weights, num_experts, g)


def _check_autograd(buf, name, x, topk_idx, topk_weights, num_experts, g) -> None:
    """Dispatch backward = reference combine of the gradients; combine backward = dispatch."""
    n = x.shape[0]
    xg, wg = x.clone().requires_grad_(), topk_weights.clone().requires_grad_()
    res = buf.dispatch(xg, topk_idx, wg, num_experts=num_experts)
    ref = reference_dispatch(x, topk_idx, topk_weights, num_experts)
    gx, gw = (
        torch.randn(res.recv_x.shape, generator=g),
        torch.randn(res.recv_topk_weights.shape, generator=g),
    )
    ((res.recv_x * gx).sum() + (res.recv_topk_weights * gw).sum()).backward()
    src = (ref.recv_src_rank, ref.recv_src_token, n)
    assert torch.equal(xg.grad, reference_combine(gx, *src)), name
    assert torch.equal(wg.grad, reference_combine(gw * (ref.recv_topk_idx >= 0), *src)), name

    y = res.recv_x.detach().clone().requires_grad_()
    wr = res.recv_topk_weights.detach().clone().requires_grad_()
    comb = buf.combine(y, res.handle, topk_weights=wr)
    gc, gcw = (
        torch.randn(n, x.shape[1], generator=g),
        torch.randn(n, topk_idx.shape[1], generator=g),
    )
    ((comb.combined_x * gc).sum() + (comb.combined_topk_weights * gcw).sum()).backward()
    assert torch.equal(y.grad, reference_dispatch(gc, topk_idx, None, num_experts).recv_x)
    assert torch.equal(wr.grad, reference_dispatch(gcw, topk_idx, None, num_experts).recv_x)


def _check_errors(ctx, buf: Buffer) -> None:
    """Bad input raises ValueError naming the value, on every rank alike (no hang)."""
    r = ctx.world_size
    idx = torch.zeros(3, 2, dtype=torch.int64)
    x = torch.zeros(3, 4)
    bad = [
        (lambda: buf.dispatch(torch.zeros(3), idx), "x must be"),
        (lambda: buf.dispatch(x, idx.float()), "dtype"),
        (lambda: buf.dispatch(x, idx + 4 * r), "expert id"),
        (lambda: buf.dispatch(x, idx, torch.zeros(3, 3)), "topk_weights.shape"),
        (lambda: buf.dispatch(x, idx, torch.zeros(3, 2, dtype=torch.int64)), "floating"),
        (lambda: buf.dispatch(x, idx[:2]), "2 rows"),
        (lambda: buf.dispatch(x, idx, expert_alignment=0), "expert_alignment=0"),
    ]
    if r > 1:
        bad.append(
            (lambda: buf.dispatch(x, idx, num_experts=4 * r + 1), f"num_experts={4 * r + 1}")
        )
        bad.append((lambda: Buffer(num_experts=r + 1, transport="dist"), f"num_experts={r + 1}"))
    for fn, needle in bad:
        with pytest.raises(ValueError, match=needle):
            fn()
    res = buf.dispatch(x, idx)
    with pytest.raises(ValueError, match="leave topk_idx"):
        buf.dispatch(x, idx, handle=res.handle)
    with pytest.raises(ValueError, match="combine: x must be"):
        buf.combine(torch.zeros(res.recv_x.shape[0] + 1, 4), res.handle)
    with pytest.raises(ValueError, match="cumulative_local_expert_recv_stats"):
        buf.dispatch(x, idx, cumulative_local_expert_recv_stats=torch.zeros(99, dtype=torch.int64))
    if r > 1:  # ranks that disagree on K all fail together after the count exchange
        k = 2 if ctx.rank == 0 else 3
        with pytest.raises(ValueError, match="disagree"):
            buf.dispatch(x, torch.zeros(3, k, dtype=torch.int64), num_experts=4 * r)


def _run_all(ctx) -> str:
    # a tiny combine scratch (3 rows of the bf16 case) so chunked widening crosses chunks
    buf = Buffer(
        num_experts=4 * ctx.world_size,
        transport="dist",  # the collective path, whose combine widens in chunks
        timeout_s=60,
        combine_chunk_bytes=3 * 56 * 4,
    )
    assert buf.path == "collective"
    for i, case in enumerate(CASES):
        if case[2] % ctx.world_size == 0:
            _check_case(ctx, buf, i)
    _check_errors(ctx, buf)
    return "ok"


@pytest.mark.parametrize("world_size", [1, 2, 4])
def test_dispatch_combine_against_reference(world_size):
    assert spawn(_run_all, world_size, timeout_s=240) == ["ok"] * world_size
