"""Low-latency dispatch / combine on 2 and 4 gloo ranks, over shared memory and over gloo's
all-to-all: every expert-major segment checked against the gathered inputs, combine against
sum(weights * expert output) computed in one process, FP8 and the receive hook included."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from nobubble.distributed import spawn
from nobubble.moe import Buffer
from nobubble.moe.fastpath.fp8 import fp8_row_bytes, per_token_cast_back, per_token_cast_to_fp8

T_MAX = 6


def _routing(kind: str, n: int, num_experts: int, topk: int, g: torch.Generator) -> torch.Tensor:
    scores = torch.rand(n, num_experts, generator=g)
    if kind == "skewed":
        scores[:, num_experts // 2 :] = -1.0  # empty experts
    idx = scores.topk(topk, dim=1).indices
    if kind == "holes":
        idx[torch.rand(idx.shape, generator=g) < 0.3] = -1
        idx[: max(1, n // 2)] = -1  # tokens whose slots are all -1
    return idx


def _expert_fn(rows: torch.Tensor, global_expert: int) -> torch.Tensor:
    """A stand-in expert: scale by (1 + expert id), in the rows' dtype."""
    return rows * (1 + global_expert)


def _check(ctx, buf: Buffer, case, use_fp8: bool, hook: bool) -> None:
    name, tokens, hidden, num_experts, topk, kind, dtype = case
    world, local = ctx.world_size, num_experts // ctx.world_size
    g = torch.Generator().manual_seed(13 * ctx.rank + len(name))
    n = tokens[ctx.rank % len(tokens)]
    idx = _routing(kind, n, num_experts, topk, g)
    x = torch.randn(n, hidden, generator=g).to(dtype)
    w = torch.rand(n, topk, generator=g)
    every: list = [None] * world
    dist.all_gather_object(every, (x, idx))
    buf.transport.reset_stats()
    res = buf.low_latency_dispatch(
        x,
        idx,
        num_max_dispatch_tokens_per_rank=T_MAX,
        num_experts=num_experts,
        use_fp8=use_fp8,
        return_recv_hook=hook,
    )
    if hook:
        _ = torch.randn(64, 64) @ torch.randn(64, 64)  # compute between send and receive
        with pytest.raises(ValueError, match=r"has not received yet; call its result's hook"):
            buf.dispatch(x, idx, num_experts=num_experts)  # would reuse the pending slots
        res.hook()
    sent_rows = 0
    for e in range(local):
        gexp = ctx.rank * local + e
        total = 0
        for i, (xi, idx_i) in enumerate(every):
            toks = (idx_i == gexp).any(dim=1).nonzero().view(-1)
            want = xi[toks]
            if use_fp8:
                want = per_token_cast_back(per_token_cast_to_fp8(want), dtype)
            c = toks.numel()
            assert int(res.handle.recv_layout[e, i]) == c, name
            assert torch.equal(res.recv_x[e, i * T_MAX : i * T_MAX + c], want), (name, e, i)
            total += c
        assert int(res.recv_count[e]) == total, name
    for j in range(world):
        if j != ctx.rank:
            sent_rows += int(((idx >= j * local) & (idx < (j + 1) * local)).sum())
    row_bytes = fp8_row_bytes(hidden) if use_fp8 else hidden * x.element_size()
    sent = buf.transport.stats().bytes_sent_remote["ll_dispatch"]
    if buf.transport.kind == "shm":  # only valid rows move
        assert sent == sent_rows * row_bytes, name
    else:  # fixed-size slots move whole
        assert sent >= sent_rows * row_bytes, name

    out = torch.empty_like(res.recv_x)
    for e in range(local):
        out[e] = _expert_fn(res.recv_x[e], ctx.rank * local + e)
    combined = buf.low_latency_combine(out, idx, w, res.handle)
    xin = per_token_cast_back(per_token_cast_to_fp8(x), dtype) if use_fp8 else x
    want = torch.zeros(n, hidden)
    for k in range(topk):  # sum_k w * expert(x), float32, slot order
        valid = idx[:, k] >= 0
        y = torch.zeros(n, hidden)
        for t in valid.nonzero().view(-1).tolist():
            y[t] = _expert_fn(xin[t : t + 1], int(idx[t, k])).float()
        want = want + (w[:, k] * valid).view(-1, 1) * y
    assert torch.equal(combined, want.to(dtype)), name


CASES = [  # name, tokens by rank, hidden, experts, topk, routing, dtype
    ("random", (6, 4, 5, 3), 16, 8, 3, "random", torch.float32),
    ("zero-tokens-holes", (0, 6, 5, 2), 12, 8, 2, "holes", torch.float32),
    ("empty-experts-k8", (5, 3, 0, 6), 10, 16, 8, "skewed", torch.bfloat16),
    ("fp8-width", (6, 5, 4, 6), 200, 8, 4, "random", torch.bfloat16),
]


def _run(ctx, kernels: bool = True) -> str:
    if not kernels:  # the torch paths the C kernels replace must give the same bits
        import os

        from nobubble.moe.fastpath import cpu_kernels

        os.environ["NOBUBBLE_CPU_KERNELS"] = "0"
        cpu_kernels.load.cache_clear()
        assert cpu_kernels.load() is None
    for transport in ("shm", "dist"):
        _run_transport(ctx, transport)
    return "ok"


def _run_transport(ctx, transport: str) -> None:
    with Buffer(transport=transport, timeout_s=60) as buf:  # one buffer: every H, E and T
        for case in CASES:
            _check(ctx, buf, case, use_fp8=False, hook=False)
            _check(ctx, buf, case, use_fp8=case[6] == torch.bfloat16, hook=True)
        with pytest.raises(ValueError, match="num_max_dispatch_tokens_per_rank=6"):
            buf.low_latency_dispatch(
                torch.zeros(7, 16),
                torch.zeros(7, 2, dtype=torch.int64),
                num_max_dispatch_tokens_per_rank=T_MAX,
                num_experts=8,
            )


@pytest.mark.parametrize("world_size", [2, 4])
def test_low_latency_equals_expected_over_shm_and_gloo(world_size):
    assert spawn(_run, world_size, timeout_s=240) == ["ok"] * world_size


def test_low_latency_torch_paths_without_the_cpu_kernels():
    assert spawn(_run, 2, args=(False,), timeout_s=240) == ["ok"] * 2


def _misuse(ctx) -> str:
    buf = Buffer(None, 4, transport="shm", timeout_s=30)
    own = torch.tensor([[2 * ctx.rank, 2 * ctx.rank + 1]] * 3)  # only this rank's experts
    x = torch.randn(3, 8, generator=torch.Generator().manual_seed(ctx.rank))
    w = torch.ones(3, 2)
    res = buf.low_latency_dispatch(
        x, own, num_max_dispatch_tokens_per_rank=4, return_recv_hook=True
    )
    with pytest.raises(
        ValueError, match=r"low_latency_combine: .* call its result's hook\(\) first"
    ):
        buf.low_latency_combine(res.recv_x, own, w, res.handle)
    res.hook()
    with pytest.raises(ValueError, match=r"must both be \[3, 2\], the dispatch's routing"):
        buf.low_latency_combine(res.recv_x, own[:, :1], w[:, :1], res.handle)
    y = buf.low_latency_combine(res.recv_x, own, w, res.handle)  # the right order still works
    assert torch.equal(y, 2 * x)
    buf.close()
    return "ok"


def test_combine_before_the_hook_or_with_other_routing_is_refused():
    assert spawn(_misuse, 2, timeout_s=120) == ["ok"] * 2
