"""Fused CPU kernels for the shared-memory fast path, compiled from C at first use.

``cpu_kernels.c`` is compiled once per machine with ``$CC`` (else ``cc``) into
``$NOBUBBLE_CACHE_DIR`` (default ``~/.cache/nobubble``), named by a hash of source, flags and
CPU, and loaded with ctypes. Without a compiler :func:`load` warns once and returns ``None``;
callers then take their torch path (same results). ``NOBUBBLE_CPU_KERNELS=0`` turns them off.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import math
import os
import platform
import shutil
import subprocess
import tempfile
import warnings
from pathlib import Path
from typing import TypeGuard

import torch

__all__ = [
    "load",
    "combine_reduce",
    "weighted_combine",
    "weighted_combine_at",
    "fp8_quantize",
    "fp8_dequantize",
    "KERNEL_DTYPES",
]

_SOURCE = Path(__file__).with_name("cpu_kernels.c")
_FLAGS = ("-O3", "-march=native", "-std=c99", "-ffp-contract=off", "-shared", "-fPIC")
KERNEL_DTYPES = (torch.bfloat16, torch.float32)
_MAX_SOURCES = 1024  # MAX_SOURCES in cpu_kernels.c
_P = ctypes.c_void_p
_I = ctypes.c_int64


def _cpu_fingerprint() -> str:
    """The CPU model and its flags: a library built with -march=native runs only there."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor() or platform.machine()
    keep = [ln for ln in text.splitlines() if ln.startswith(("model name", "flags", "Features"))]
    return "\n".join(sorted(set(keep)))


def _cache_dir(fallback: Path) -> Path:
    """``$NOBUBBLE_CACHE_DIR/kernels``, else ``~/.cache/nobubble/kernels``; ``fallback`` where
    there is no home directory."""
    root = os.environ.get("NOBUBBLE_CACHE_DIR")
    if root:
        return Path(root) / "kernels"
    try:
        return Path.home() / ".cache" / "nobubble" / "kernels"
    except RuntimeError:  # no home directory to be found
        return fallback


def _compile(cc: str, target: Path) -> None:
    """Build into a temporary name and rename, so concurrent ranks never load half a file."""
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=target.parent)
    os.close(fd)
    try:
        subprocess.run(
            [cc, *_FLAGS, "-o", tmp, str(_SOURCE)],
            check=True,
            capture_output=True,
            text=True,
            timeout=120,
        )
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


@functools.cache
def load() -> ctypes.CDLL | None:
    """The compiled kernels, or ``None`` (with one warning) where they cannot be built."""
    if os.environ.get("NOBUBBLE_CPU_KERNELS", "1") == "0":
        return None
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        warnings.warn(
            "nobubble: no C compiler (cc/gcc) found; the shared-memory combine uses its "
            "slower torch path. Install gcc to enable the fused kernel.",
            RuntimeWarning,
            stacklevel=2,
        )
        return None
    key = hashlib.sha256(
        _SOURCE.read_bytes() + " ".join((cc, *_FLAGS)).encode() + _cpu_fingerprint().encode()
    ).hexdigest()[:16]
    name = f"cpu_kernels-{key}.so"
    tmp_dir = Path(tempfile.gettempdir()) / f"nobubble-kernels-{os.getuid()}"
    try:
        target = _cache_dir(tmp_dir) / name
        if not target.exists():
            try:
                _compile(cc, target)
            except OSError:  # a read-only or full home: build in the temporary directory
                target = tmp_dir / name
                if not target.exists():
                    _compile(cc, target)
        lib = ctypes.CDLL(str(target))
    except (OSError, subprocess.SubprocessError) as err:
        detail = getattr(err, "stderr", None) or err
        warnings.warn(
            f"nobubble: building the CPU kernels with {cc} failed ({str(detail).strip()[:300]}); "
            "the shared-memory combine uses its slower torch path",
            RuntimeWarning,
            stacklevel=2,
        )
        return None
    for name, extra in (("combine_reduce_bf16", [_P, _P]), ("combine_reduce_f32", [_P])):
        fn = getattr(lib, name)
        fn.restype = _I
        fn.argtypes = [_I, _P, _P, _P, _I, _I, *extra]
    for name, extra in (("weighted_combine_bf16", [_P, _P]), ("weighted_combine_f32", [_P])):
        fn = getattr(lib, name)
        fn.restype = _I
        fn.argtypes = [_I, _I, _I, _P, _P, *extra]
    lib.fp8_quantize.restype = _I
    lib.fp8_quantize.argtypes = [_I, _I, _P, _I, _P, _I]
    lib.fp8_dequantize.restype = _I
    lib.fp8_dequantize.argtypes = [_I, _I, _P, _I, _P, _P, _I]
    return lib


def combine_reduce(
    rows: list[torch.Tensor], token_idx: list[torch.Tensor], num_tokens: int, out: torch.Tensor
) -> bool:
    """``out[n] = sum_r rows[r][token_idx[r] == n]`` in float32, sources in list order.

    Args:
        rows: per source ``[n_r, *]`` contiguous CPU tensors of ``out``'s dtype (bf16 or fp32).
        token_idx: per source int64 ``[n_r]`` token indices, ascending and distinct.
        num_tokens: ``N``.
        out: ``[N, *]`` contiguous, written in full (tokens no source holds become 0).

    Returns ``False`` (``out`` untouched) when the kernel is unavailable or does not cover
    these dtypes/layouts - the caller then runs its torch path. Raises ``ValueError`` when a
    source's token indices are not ascending and distinct (or out of range).
    """
    lib = load()
    if (
        lib is None
        or len(rows) > _MAX_SOURCES
        or out.dtype not in KERNEL_DTYPES
        or not _on_cpu(out, *rows, *token_idx)
        or not out.is_contiguous()
        or any(r.dtype != out.dtype or not r.is_contiguous() for r in rows)
        or any(i.dtype != torch.int64 or not i.is_contiguous() for i in token_idx)
    ):
        return False
    if len(rows) != len(token_idx):
        raise ValueError(f"combine_reduce: {len(rows)} row blocks but {len(token_idx)} index lists")
    hidden = math.prod(out.shape[1:])
    for r, (x, i) in enumerate(zip(rows, token_idx)):
        if x.shape[0] != i.shape[0] or math.prod(x.shape[1:]) != hidden:
            raise ValueError(
                f"combine_reduce: source {r} has rows {tuple(x.shape)} for {i.shape[0]} tokens "
                f"and hidden size {hidden}; give one row of out's width per token"
            )
    if num_tokens != out.shape[0]:
        raise ValueError(f"combine_reduce: num_tokens={num_tokens} but out has {out.shape[0]} rows")
    n = len(rows)
    row_ptrs = (ctypes.c_void_p * n)(*[x.data_ptr() for x in rows])
    idx_ptrs = (ctypes.c_void_p * n)(*[i.data_ptr() for i in token_idx])
    counts = (ctypes.c_int64 * n)(*[i.shape[0] for i in token_idx])
    args = [n, row_ptrs, idx_ptrs, counts, num_tokens, hidden, out.data_ptr()]
    if out.dtype == torch.bfloat16:
        acc = torch.empty(max(1, hidden), dtype=torch.float32)
        rc = lib.combine_reduce_bf16(*args, acc.data_ptr())
    else:
        rc = lib.combine_reduce_f32(*args)
    if rc != 0:
        r = -1 - rc
        raise ValueError(
            f"combine_reduce: source {r}'s token indices are not ascending, distinct and below "
            f"num_tokens={num_tokens} ({_first_bad(token_idx[r], num_tokens)}); pass the "
            "handle's send_token_idx segments"
        )
    return True


def _first_bad(idx: torch.Tensor, num_tokens: int) -> str:
    """Where a token index list first breaks 'ascending, distinct, in [0, num_tokens)'."""
    values = idx.tolist()
    for k, v in enumerate(values):
        if not 0 <= v < num_tokens:
            return f"position {k} holds {v}"
        if k and v <= values[k - 1]:
            return f"position {k} holds {v} after {values[k - 1]}"
    return "no bad position found"


def _on_cpu(*tensors: torch.Tensor) -> bool:
    return all(t.device.type == "cpu" for t in tensors)


def weighted_combine(
    rows: torch.Tensor, row_of: torch.Tensor, weights: torch.Tensor, out: torch.Tensor
) -> bool:
    """``out[n] = sum_k weights[n, k] * rows[row_of[n, k]]`` in float32, ``k`` ascending.

    Args:
        rows: ``[P, H]`` contiguous CPU tensor of ``out``'s dtype (bf16 or fp32).
        row_of: int64 ``[N, K]``, the row of each (token, slot); -1 where the slot routed
            nowhere (it contributes nothing).
        weights: float32 ``[N, K]``.
        out: ``[N, H]`` contiguous, written in full.

    Returns ``False`` (``out`` untouched) when the kernel is unavailable or does not cover
    these dtypes/layouts. Raises ``ValueError`` for a row index out of range.
    """
    if not (
        rows.dtype == out.dtype
        and rows.is_contiguous()
        and row_of.dtype == torch.int64
        and _on_cpu(rows, row_of, weights, out)
    ):
        return False
    if rows.dim() != 2 or row_of.dim() != 2 or rows.shape[1:] != out.shape[1:]:
        raise ValueError(
            f"weighted_combine: rows {tuple(rows.shape)}, row_of {tuple(row_of.shape)} and out "
            f"{tuple(out.shape)} disagree; want [P, H], [N, K], [N, H]"
        )
    bad = ((row_of < -1) | (row_of >= rows.shape[0])).nonzero()
    if bad.numel():
        n, k = bad[0].tolist()
        raise ValueError(
            f"weighted_combine: row_of[{n}, {k}] = {int(row_of[n, k])} is outside rows' "
            f"{rows.shape[0]} (use -1 for a slot without a row); pass the dispatch handle's "
            "(token, slot) rows"
        )
    row_bytes = rows.shape[1] * rows.element_size()
    addr = torch.where(row_of >= 0, rows.data_ptr() + row_of * row_bytes, 0)  # (N, K)
    return weighted_combine_at(addr, weights, out, keep_alive=rows)


def weighted_combine_at(
    row_addr: torch.Tensor, weights: torch.Tensor, out: torch.Tensor, *, keep_alive: object
) -> bool:
    """:func:`weighted_combine` over rows given by address: ``row_addr`` int64 ``[N, K]`` holds
    the ``data_ptr`` of each (token, slot)'s row of ``H`` elements of ``out``'s dtype (0: no row),
    so the rows may stay where they are (shared-memory slots, several tensors). The caller
    guarantees every address stays valid for the call; ``keep_alive`` is whatever owns them.
    """
    lib = load()
    if (
        lib is None
        or out.dtype not in KERNEL_DTYPES
        or not _on_cpu(out, row_addr, weights)
        or out.dim() != 2
        or not out.is_contiguous()
        or weights.dtype != torch.float32
    ):
        return False
    num_tokens, hidden = out.shape
    if (
        row_addr.dtype != torch.int64
        or row_addr.shape != (num_tokens, weights.shape[-1])
        or (weights.shape != row_addr.shape)
    ):
        raise ValueError(
            f"weighted_combine: row_addr {tuple(row_addr.shape)} {row_addr.dtype}, weights "
            f"{tuple(weights.shape)} and out {tuple(out.shape)} disagree; want int64 [N, K], "
            "[N, K], [N, H]"
        )
    row_addr, weights = row_addr.contiguous(), weights.contiguous()
    topk = row_addr.shape[1]
    args = [num_tokens, topk, hidden, row_addr.data_ptr(), weights.data_ptr(), out.data_ptr()]
    if out.dtype == torch.bfloat16:
        acc = torch.empty(max(1, hidden), dtype=torch.float32)
        lib.weighted_combine_bf16(*args, acc.data_ptr())
    else:
        lib.weighted_combine_f32(*args)
    return True


@functools.cache
def _e4m3_table() -> torch.Tensor:
    """float32 ``[256]``: torch's own decoding of every e4m3fn byte."""
    return torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).float()


def _fp8_rows_ok(
    lib: ctypes.CDLL | None, t: torch.Tensor, packed: torch.Tensor, hidden: int
) -> TypeGuard[ctypes.CDLL]:
    return (
        lib is not None
        and t.dtype in KERNEL_DTYPES
        and t.device.type == "cpu"
        and packed.device.type == "cpu"
        and t.dim() == 2
        and t.shape[1] == hidden
        and t.is_contiguous()
        and packed.dtype == torch.uint8
        and packed.dim() == 2
        and packed.shape[0] == t.shape[0]
        and packed.stride(1) == 1
        and packed.shape[1] == hidden + 4 * (-(-hidden // 128))
    )


def fp8_quantize(x: torch.Tensor, packed: torch.Tensor) -> bool:
    """Quantise ``x [N, H]`` (bf16/fp32) into ``packed [N, H + 4 * ceil(H / 128)]`` uint8:
    e4m3 values, then one float32 scale per 128 channels, exactly as
    ``pack_fp8(per_token_cast_to_fp8(x))``. ``False``: not covered, nothing written."""
    lib = load()
    if not _fp8_rows_ok(lib, x, packed, x.shape[-1] if x.dim() == 2 else -1):
        return False
    n, hidden = x.shape
    lib.fp8_quantize(
        n, hidden, x.data_ptr(), int(x.dtype == torch.bfloat16), packed.data_ptr(), packed.stride(0)
    )
    return True


def fp8_dequantize(packed: torch.Tensor, out: torch.Tensor) -> bool:
    """Inverse of :func:`fp8_quantize` into ``out [N, H]`` (bf16/fp32), exactly as
    ``per_token_cast_back(unpack_fp8(packed, H), out.dtype)``. ``False``: not covered."""
    lib = load()
    if not _fp8_rows_ok(lib, out, packed, out.shape[-1] if out.dim() == 2 else -1):
        return False
    n, hidden = out.shape
    table = _e4m3_table()
    lib.fp8_dequantize(
        n,
        hidden,
        packed.data_ptr(),
        packed.stride(0),
        table.data_ptr(),
        out.data_ptr(),
        int(out.dtype == torch.bfloat16),
    )
    return True
