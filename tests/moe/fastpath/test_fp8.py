"""FP8 (e4m3, one scale per 128 channels): the cast against a brute-force nearest-grid-value
quantiser, error bounds (hypothesis), packing, and FP8 dispatch on 2 gloo ranks."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from nobubble.distributed import spawn
from nobubble.moe import Buffer
from nobubble.moe.fastpath.fp8 import (
    FP8_MAX,
    fp8_dispatch,
    fp8_row_bytes,
    pack_fp8,
    per_token_cast_back,
    per_token_cast_to_fp8,
    unpack_fp8,
)
from tests.moe.reference import reference_dispatch

_CODES = torch.arange(256, dtype=torch.int64)
_VALUES = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).float()
_FINITE = ~torch.isnan(_VALUES)
GRID, GRID_CODES = _VALUES[_FINITE], _CODES[_FINITE]  # every finite e4m3 value and its code


def nearest_e4m3(v: torch.Tensor) -> torch.Tensor:
    """Round each value to the nearest e4m3 value, ties to the even code (brute force)."""
    flat = v.reshape(-1, 1)
    dist = (flat - GRID.view(1, -1)).abs()  # (n, 254)
    best = dist.min(dim=1, keepdim=True).values
    tie_break = (GRID_CODES % 2).view(1, -1) * 1e-30  # prefer even mantissa among equals
    choice = torch.where(dist == best, tie_break, math.inf).argmin(dim=1)
    return GRID[choice].view(v.shape)


def reference_quantise(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-block amax scaling written out block by block, then brute-force rounding."""
    n, h = x.shape
    out = torch.zeros(n, h)
    scales = torch.zeros(n, math.ceil(h / 128))
    for b in range(scales.shape[1]):
        blk = x[:, b * 128 : (b + 1) * 128].float()
        amax = blk.abs().amax(dim=1).clamp(min=1e-4)
        scales[:, b] = amax / 448.0
        out[:, b * 128 : (b + 1) * 128] = nearest_e4m3(blk * (448.0 / amax).unsqueeze(1))
    return out, scales


@settings(max_examples=40, deadline=None)
@given(
    n=st.integers(0, 4),
    h=st.integers(1, 300),
    log_scale=st.floats(-6, 6),
    seed=st.integers(0, 2**31 - 1),
)
def test_cast_matches_brute_force_and_error_bound(n, h, log_scale, seed):
    x = torch.randn(n, h, generator=torch.Generator().manual_seed(seed)) * 10.0**log_scale
    q = per_token_cast_to_fp8(x)
    want_data, want_scales = reference_quantise(x)
    assert q.data.dtype == torch.float8_e4m3fn and q.scales.shape == want_scales.shape
    assert torch.equal(q.data.float(), want_data)
    assert torch.equal(q.scales, want_scales)
    back = per_token_cast_back(q, torch.float32)
    scale_per_channel = q.scales.repeat_interleave(128, dim=1)[:, :h]
    bound = x.abs() * 2.0**-4 + scale_per_channel * 2.0**-10  # rounding + subnormal spacing
    assert ((back - x).abs() <= bound).all()


def test_representable_values_round_trip_exactly():
    grid = GRID[GRID.abs() <= FP8_MAX]
    x = grid[torch.randperm(grid.numel(), generator=torch.Generator().manual_seed(0))][:254]
    x = x.view(2, 127).clone()  # 127 channels: one short block per row
    x[:, 0] = FP8_MAX  # block amax = 448: scale 1
    x = x * 0.125  # scale 1/8, a power of two: still exact
    assert torch.equal(per_token_cast_back(per_token_cast_to_fp8(x), torch.float32), x)


def test_pack_unpack_and_bytes_halved():
    x = torch.randn(5, 7168).to(torch.bfloat16)
    q = per_token_cast_to_fp8(x)
    packed = pack_fp8(q)
    assert packed.shape == (5, fp8_row_bytes(7168)) == (5, 7168 + 4 * 56)
    u = unpack_fp8(packed, 7168)
    assert torch.equal(u.data.view(torch.uint8), q.data.view(torch.uint8))
    assert torch.equal(u.scales, q.scales)
    assert fp8_row_bytes(7168) / (7168 * 2) == pytest.approx(0.5156, abs=1e-4)
    with pytest.raises(ValueError, match="hidden=100"):
        unpack_fp8(packed, 100)
    with pytest.raises(ValueError, match="floating"):
        per_token_cast_to_fp8(torch.zeros(2, 3, dtype=torch.int64))


def _routing(n: int, num_experts: int, topk: int, g: torch.Generator) -> torch.Tensor:
    idx = torch.rand(n, num_experts, generator=g).topk(topk, dim=1).indices
    idx[torch.rand(idx.shape, generator=g) < 0.25] = -1
    if n:
        idx[0] = -1  # a token that goes nowhere
    return idx


def _fp8_rank(ctx) -> str:
    hidden, num_experts = 200, 8
    for buf in (Buffer(transport="dist", timeout_s=30), Buffer(transport="shm", timeout_s=30)):
        for tokens in ((0, 7, 3, 5), (9, 4, 6, 2)):  # a rank with no tokens, then all busy
            g = torch.Generator().manual_seed(ctx.rank + 10 * tokens[0])
            n = tokens[ctx.rank]
            idx = _routing(n, num_experts, 3, g)
            x = torch.randn(n, hidden, generator=g).to(torch.bfloat16)
            buf.transport.reset_stats()
            res = fp8_dispatch(buf, x, idx, num_experts=num_experts)
            fp8_bytes = buf.transport.stats().bytes_sent["x"]
            ref = reference_dispatch(x, idx, None, num_experts)
            want = per_token_cast_back(per_token_cast_to_fp8(ref.recv_x), torch.bfloat16)
            assert torch.equal(res.recv_x, want)
            assert torch.equal(res.recv_topk_idx, ref.recv_topk_idx)
            rows = int(res.handle.is_token_in_rank.sum())
            assert fp8_bytes == rows * fp8_row_bytes(hidden)
            buf.transport.reset_stats()
            buf.dispatch(x, idx, num_experts=num_experts)
            assert buf.transport.stats().bytes_sent["x"] == rows * hidden * 2
            combined = buf.combine(res.recv_x, res.handle).combined_x  # combine stays bf16
            assert combined.dtype == torch.bfloat16 and combined.shape == x.shape
        buf.close()
    return "ok"


@pytest.mark.parametrize("world_size", [2, 4])
def test_fp8_dispatch_equals_quantised_reference(world_size):
    assert spawn(_fp8_rank, world_size, timeout_s=120) == ["ok"] * world_size
