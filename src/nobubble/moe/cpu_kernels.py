"""Fused CPU kernels for the shared-memory fast path, compiled from C at first use.

DeepEP's speed comes from kernels that fuse what a framework does in several passes. On
CPU the pass that matters is combine's reduction: summing each token's rows from every
expert rank in float32 takes torch three passes over memory (widen, ``index_add_``, narrow)
and one kernel here (``cpu_kernels.c``), at the machine's copy bandwidth.

The C file is compiled once per machine with the system C compiler (``$CC``, else ``cc``)
into ``$NOBUBBLE_CACHE_DIR`` (default ``~/.cache/nobubble``), named by a hash of the source,
the flags and the CPU, and loaded with ctypes. Where no compiler is found or compilation
fails, :func:`load` returns ``None`` once with a warning and callers use their torch path:
the results are the same, only slower. ``NOBUBBLE_CPU_KERNELS=0`` turns the kernels off.
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

import torch

__all__ = ["load", "combine_reduce", "KERNEL_DTYPES"]

_SOURCE = Path(__file__).with_name("cpu_kernels.c")
_FLAGS = ("-O3", "-march=native", "-std=c99", "-shared", "-fPIC")
KERNEL_DTYPES = (torch.bfloat16, torch.float32)
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


def _cache_dir() -> Path:
    root = os.environ.get("NOBUBBLE_CACHE_DIR") or Path.home() / ".cache" / "nobubble"
    return Path(root) / "kernels"


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
    fallback = Path(tempfile.gettempdir()) / f"nobubble-kernels-{os.getuid()}" / name
    try:
        target = _cache_dir() / name
        if not target.exists():
            try:
                _compile(cc, target)
            except PermissionError:  # a read-only home: build in the temporary directory
                target = fallback
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
        or out.dtype not in KERNEL_DTYPES
        or not out.is_contiguous()
        or out.device.type != "cpu"
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
        raise ValueError(
            f"combine_reduce: source {-1 - rc}'s token indices are not ascending, distinct "
            f"and below num_tokens={num_tokens}; pass the handle's send_token_idx segments"
        )
    return True
