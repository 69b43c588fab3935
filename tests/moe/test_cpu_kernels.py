"""The fused combine kernel against a slow per-token reference, and the output cache."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from nobubble.moe import cpu_kernels
from nobubble.moe.cpu_memory import RecycledOutputs


def _slow_reduce(rows, token_idx, num_tokens, dtype):
    """Per token, per source in order, float32 adds starting from +0.0, then one rounding."""
    hidden = rows[0].shape[1] if rows else 0
    acc = np.zeros((num_tokens, hidden), dtype=np.float32)
    for x, idx in zip(rows, token_idx):
        xf = x.to(torch.float32).numpy()
        for k, n in enumerate(idx.tolist()):
            with np.errstate(over="ignore"):  # inf where two huge values meet, as in C
                acc[n] = acc[n] + xf[k]  # float32 + float32 -> float32, round to nearest
    return torch.from_numpy(acc).to(dtype)


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
    want = _slow_reduce(rows, token_idx, n, dtype)
    assert torch.equal(out.view(-1).view(torch.uint8), want.view(-1).view(torch.uint8))


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
