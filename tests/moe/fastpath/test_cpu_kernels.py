"""The fused combine kernel against a slow per-token reference, and the output cache."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import nobubble.moe.fastpath.cpu_kernels as cpu_kernels
from nobubble.moe.fastpath.cpu_memory import RecycledOutputs
from nobubble.moe.fastpath.fp8 import (
    fp8_row_bytes,
    pack_fp8,
    per_token_cast_back,
    per_token_cast_to_fp8,
    unpack_fp8,
)


def _slow_reduce(rows, token_idx, num_tokens, dtype):
    """Per token, per source in order, float32 adds starting from +0.0, then one rounding."""
    hidden = rows[0].shape[1] if rows else 0
    acc = np.zeros((num_tokens, hidden), dtype=np.float32)
    for x, idx in zip(rows, token_idx):
        xf = x.to(torch.float32).numpy()
        for k, n in enumerate(idx.tolist()):
            with np.errstate(over="ignore", invalid="ignore"):  # inf / NaN, as in C
                acc[n] = acc[n] + xf[k]  # float32 + float32 -> float32, round to nearest
    return torch.from_numpy(acc).to(dtype)


def _same_bits(got: torch.Tensor, want: torch.Tensor) -> bool:
    """Bit-equal wherever ``want`` is a number, NaN exactly where it is NaN (torch itself writes
    a NaN's bits differently on its scalar and vector paths)."""
    nan = want.isnan()
    if not torch.equal(got.isnan(), nan):
        return False
    ints = {torch.bfloat16: torch.int16, torch.float32: torch.int32}[want.dtype]
    return torch.equal(got[~nan].view(ints), want[~nan].view(ints))


def _case(draw_sizes, seed, dtype, special: bool):
    num_tokens, hidden, presence = draw_sizes
    g = torch.Generator().manual_seed(seed)
    rows, token_idx = [], []
    for mask in presence:
        idx = torch.tensor([n for n in range(num_tokens) if mask[n % len(mask)]], dtype=torch.long)
        x = torch.randn(len(idx), hidden, generator=g) * 1000
        if special and x.numel():
            flat = x.view(-1)
            flat[0] = float("inf")
            flat[-1] = -0.0
            flat[len(flat) // 2] = 3.0e38  # overflows when two of them meet
            flat[len(flat) // 3] = float("nan")  # NaN rounds to torch's 0xffff in bf16
        rows.append(x.to(dtype))
        token_idx.append(idx)
    return rows, token_idx, num_tokens


needs_cc = pytest.mark.skipif(
    shutil.which("cc") is None and shutil.which("gcc") is None, reason="no C compiler"
)


@needs_cc
def test_kernel_builds_where_a_compiler_exists():
    assert cpu_kernels.load() is not None


@needs_cc
@settings(max_examples=40, deadline=None)
@given(
    num_tokens=st.integers(0, 40),
    hidden=st.integers(1, 70),
    presence=st.lists(st.lists(st.booleans(), min_size=1, max_size=7), min_size=1, max_size=6),
    seed=st.integers(0, 2**16),
    bf16=st.booleans(),
    special=st.booleans(),
)
def test_kernel_equals_slow_reference_bit_for_bit(
    num_tokens, hidden, presence, seed, bf16, special
):
    dtype = torch.bfloat16 if bf16 else torch.float32
    rows, token_idx, n = _case((num_tokens, hidden, presence), seed, dtype, special)
    out = torch.full((n, hidden), 7.0, dtype=dtype)  # every element must be overwritten
    assert cpu_kernels.combine_reduce(rows, token_idx, n, out)
    assert _same_bits(out, _slow_reduce(rows, token_idx, n, dtype))


@needs_cc
def test_kernel_equals_buffer_combine_rows_arithmetic_on_a_large_case():
    """The torch path Buffer.combine_rows uses (zeros + index_add_ in float32, then narrow)."""
    g = torch.Generator().manual_seed(3)
    num_tokens, hidden = 300, 1000
    token_idx = [(torch.rand(num_tokens, generator=g) < p).nonzero().squeeze(1) for p in (0.9, 0.5)]
    rows = [torch.randn(len(i), hidden, generator=g).to(torch.bfloat16) for i in token_idx]
    want = torch.zeros(num_tokens, hidden)
    for x, i in zip(rows, token_idx):
        want.index_add_(0, i, x.float())
    out = torch.empty(num_tokens, hidden, dtype=torch.bfloat16)
    assert cpu_kernels.combine_reduce(rows, token_idx, num_tokens, out)
    assert torch.equal(out, want.to(torch.bfloat16))


@needs_cc
@pytest.mark.parametrize(
    "idx", [[2, 1], [1, 1], [0, 5]], ids=["descending", "duplicate", "out-of-range"]
)
def test_kernel_rejects_bad_token_indices(idx):
    rows = [torch.ones(2, 3)]
    with pytest.raises(ValueError, match="source 0's token indices are not ascending"):
        cpu_kernels.combine_reduce(rows, [torch.tensor(idx)], 4, torch.empty(4, 3))


def test_kernel_declines_what_it_does_not_cover():
    out = torch.empty(2, 3, dtype=torch.float16)
    assert not cpu_kernels.combine_reduce([torch.ones(1, 3).half()], [torch.tensor([0])], 2, out)
    out = torch.empty(3, 2).t()  # not contiguous
    assert not cpu_kernels.combine_reduce([torch.ones(1, 3)], [torch.tensor([0])], 2, out)


def test_kernels_can_be_turned_off(monkeypatch):
    monkeypatch.setenv("NOBUBBLE_CPU_KERNELS", "0")
    cpu_kernels.load.cache_clear()
    try:
        assert cpu_kernels.load() is None
        assert not cpu_kernels.combine_reduce(
            [torch.ones(1, 3)], [torch.tensor([0])], 1, torch.empty(1, 3)
        )
    finally:
        monkeypatch.delenv("NOBUBBLE_CPU_KERNELS")
        cpu_kernels.load.cache_clear()


def test_kernel_build_failure_warns_and_falls_back(monkeypatch, tmp_path):
    monkeypatch.setenv("CC", str(tmp_path / "no-such-compiler"))
    monkeypatch.setenv("NOBUBBLE_CACHE_DIR", str(tmp_path))
    cpu_kernels.load.cache_clear()
    try:
        with pytest.warns(RuntimeWarning, match="building the CPU kernels .* failed"):
            assert cpu_kernels.load() is None
    finally:
        cpu_kernels.load.cache_clear()


def _slow_weighted(rows, row_of, weights, dtype):
    """Per token, slots in order: float32 product, then float32 add, from +0.0."""
    n, k = row_of.shape
    hidden = rows.shape[1]
    xf = rows.to(torch.float32).numpy()
    w = weights.numpy()
    acc = np.zeros((n, hidden), dtype=np.float32)
    with np.errstate(over="ignore", invalid="ignore"):
        for t in range(n):
            for s in range(k):
                r = int(row_of[t, s])
                if r >= 0:
                    acc[t] = acc[t] + w[t, s] * xf[r]  # float32 * float32 rounds first
    return torch.from_numpy(acc).to(dtype)


@needs_cc
@settings(max_examples=40, deadline=None)
@given(
    num_tokens=st.integers(0, 12),
    topk=st.integers(1, 8),
    hidden=st.integers(1, 50),
    seed=st.integers(0, 2**16),
    bf16=st.booleans(),
)
def test_weighted_combine_equals_slow_reference_bit_for_bit(num_tokens, topk, hidden, seed, bf16):
    dtype = torch.bfloat16 if bf16 else torch.float32
    g = torch.Generator().manual_seed(seed)
    valid = torch.rand(num_tokens, topk, generator=g) < 0.7
    row_of = torch.full((num_tokens, topk), -1, dtype=torch.int64)
    row_of[valid] = torch.randperm(int(valid.sum()), generator=g)  # rows in any order
    rows = (torch.randn(int(valid.sum()), hidden, generator=g) * 100).to(dtype)
    weights = torch.rand(num_tokens, topk, generator=g) * 3 - 1  # some negative, some tiny
    out = torch.full((num_tokens, hidden), 5.0, dtype=dtype)
    assert cpu_kernels.weighted_combine(rows, row_of, weights, out)
    want = _slow_weighted(rows, row_of, weights, dtype)
    assert torch.equal(out.view(-1).view(torch.uint8), want.view(-1).view(torch.uint8))


@needs_cc
def test_weighted_combine_rounds_each_product_before_adding():
    """a * b + c with one rounding (a fused multiply-add) differs here from two roundings."""
    a, b, c = 1 + 2**-12, 1 + 2**-12, -1.0
    rows = torch.tensor([[b], [c]], dtype=torch.float32)
    row_of = torch.tensor([[1, 0]])  # slot 0: c (weight 1), slot 1: a * b
    weights = torch.tensor([[1.0, a]])
    out = torch.empty(1, 1)
    assert cpu_kernels.weighted_combine(rows, row_of, weights, out)
    two_roundings = torch.tensor(a, dtype=torch.float32) * torch.tensor(b) + torch.tensor(c)
    assert float(out) == float(two_roundings) == 2**-11  # fused would keep 2^-11 + 2^-24


def test_weighted_combine_rejects_bad_rows_and_shapes():
    if cpu_kernels.load() is None:
        pytest.skip("no C compiler")
    with pytest.raises(ValueError, match="outside rows' 1"):
        cpu_kernels.weighted_combine(
            torch.ones(1, 3), torch.tensor([[0, 1]]), torch.ones(1, 2), torch.empty(1, 3)
        )
    with pytest.raises(ValueError, match="disagree"):
        cpu_kernels.weighted_combine(
            torch.ones(1, 3), torch.tensor([[0, 0]]), torch.ones(1, 2), torch.empty(2, 3)
        )


def _torch_fp8(x: torch.Tensor) -> torch.Tensor:
    return pack_fp8(per_token_cast_to_fp8(x))


@needs_cc
@settings(max_examples=40, deadline=None)
@given(
    num_tokens=st.integers(0, 5),
    hidden=st.integers(1, 300),
    exponent=st.floats(-9, 4),
    seed=st.integers(0, 2**16),
    bf16=st.booleans(),
    nan=st.booleans(),
)
def test_fp8_kernels_equal_the_torch_casts_bit_for_bit(
    num_tokens, hidden, exponent, seed, bf16, nan
):
    dtype = torch.bfloat16 if bf16 else torch.float32
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(num_tokens, hidden, generator=g) * 10**exponent
    if num_tokens:
        x[0, : min(hidden, 128)] = 0.0  # an all-zero block: amax clamps to 1e-4
        if nan:  # a NaN makes its whole block (values and scale) NaN
            x[-1, hidden // 2] = float("nan")
    x = x.to(dtype)
    packed = torch.empty(num_tokens, fp8_row_bytes(hidden), dtype=torch.uint8)
    assert cpu_kernels.fp8_quantize(x, packed)
    assert torch.equal(packed, _torch_fp8(x))
    for out_dtype in (torch.bfloat16, torch.float32):
        out = torch.empty(num_tokens, hidden, dtype=out_dtype)
        assert cpu_kernels.fp8_dequantize(packed, out)
        assert _same_bits(out, per_token_cast_back(unpack_fp8(packed, hidden), out_dtype))


@needs_cc
def test_fp8_cast_equals_torch_on_every_bf16_magnitude_and_random_low_bits():
    """Blocks whose amax is exactly 448 are cast unscaled: every finite value below 480
    (all bf16 bit patterns, then the same with random low mantissa bits) against torch."""
    bits = torch.arange(0, 1 << 16, dtype=torch.int32) << 16  # every bf16 pattern, as fp32 bits
    g = torch.Generator().manual_seed(0)
    for low in (torch.zeros_like(bits), torch.randint(0, 1 << 16, bits.shape, generator=g)):
        v = (bits | low).view(torch.float32)
        v = v[v.abs() < 448]  # in range (and finite), so the block max below stays 448
        v = v[: v.numel() // 127 * 127].view(-1, 127)
        x = torch.cat([torch.full((v.shape[0], 1), 448.0), v], dim=1).contiguous()  # (n, 128)
        packed = torch.empty(x.shape[0], fp8_row_bytes(128), dtype=torch.uint8)
        assert cpu_kernels.fp8_quantize(x, packed)
        assert torch.equal(packed[:, :128], x.to(torch.float8_e4m3fn).view(torch.uint8))


# -- the output cache ------------------------------------------------------------------------
MB = 1 << 20


def test_dropped_output_is_reused_and_held_one_is_not():
    cache = RecycledOutputs(max_buffers=2, min_bytes=MB)
    a = cache.empty((MB,), torch.float32)  # 4 MiB
    ptr = a.data_ptr()
    del a
    b = cache.empty((2 * MB,), torch.bfloat16)  # 4 MiB again: the same memory
    assert b.data_ptr() == ptr and b.shape == (2 * MB,) and b.dtype == torch.bfloat16
    c = cache.empty((MB,), torch.float32)  # b is alive: new memory
    assert c.data_ptr() != b.data_ptr()
    assert (cache.hits, cache.misses) == (1, 2)


@pytest.mark.parametrize("keep", ["view", "numpy", "slice"])
def test_memory_referenced_through_a_view_is_not_reused(keep):
    cache = RecycledOutputs(max_buffers=2, min_bytes=MB)
    a = cache.empty((MB,), torch.float32)
    a.fill_(1.0)
    held = {"view": lambda t: t.view(2, -1), "numpy": lambda t: t.numpy(), "slice": lambda t: t[5:]}
    other = held[keep](a)
    del a
    b = cache.empty((MB,), torch.float32)
    b.fill_(2.0)
    assert float(other.sum()) == float(np.prod(other.shape))  # still all ones


def test_small_requests_bypass_the_cache_and_the_cache_is_bounded():
    cache = RecycledOutputs(max_buffers=1, min_bytes=MB)
    cache.empty((10,), torch.float32)
    assert cache.cached_bytes() == 0
    a = cache.empty((MB,), torch.uint8)
    b = cache.empty((MB,), torch.uint8)  # a is alive and the cache is full: not cached
    assert cache.cached_bytes() == MB and a.data_ptr() != b.data_ptr()
    del a, b
    big = cache.empty((3 * MB,), torch.uint8)  # the cached 1 MiB is too small: replaced
    assert cache.cached_bytes() == 3 * MB
    del big
    cache.clear()
    assert cache.cached_bytes() == 0
    with pytest.raises(ValueError, match="max_buffers=-1"):
        RecycledOutputs(max_buffers=-1)
