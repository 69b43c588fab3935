"""Large CPU outputs without the page-fault bill: huge pages and a small caching allocator.

:func:`empty_hugepages` advises transparent huge pages; :class:`RecycledOutputs` keeps the last
few large output buffers and hands one out again once nothing outside the cache refers to its
memory (a tensor, view, numpy array or autograd save keeps it out of reuse).
"""

from __future__ import annotations

import ctypes
import math
import sys

import torch

__all__ = ["empty_hugepages", "RecycledOutputs"]

_HUGE_PAGE = 2 << 20
_MADV_HUGEPAGE = 14
_LIBC = ctypes.CDLL(None, use_errno=True) if sys.platform == "linux" else None
if _LIBC is not None:
    _LIBC.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
_USE_COUNT = getattr(torch._C, "_storage_Use_Count", None)


def empty_hugepages(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """``torch.empty`` whose interior 2 MiB pages are advised as transparent huge pages.

    A fresh 200 MB output costs 50 000 page faults when first written (the kernel zeroes every
    4 KiB page), which on CPU is several times the cost of the copy itself; with huge pages
    it is 100 faults. Elsewhere than Linux this is plain ``torch.empty``.
    """
    t = torch.empty(shape, dtype=dtype)
    nbytes = t.numel() * t.element_size()
    if _LIBC is not None and nbytes >= 2 * _HUGE_PAGE:
        start = -(-t.data_ptr() // _HUGE_PAGE) * _HUGE_PAGE
        end = (t.data_ptr() + nbytes) // _HUGE_PAGE * _HUGE_PAGE
        if end > start:
            _LIBC.madvise(start, end - start, _MADV_HUGEPAGE)  # advice only: errors are harmless
    return t


def _unused(buf: torch.Tensor) -> bool:
    """True when only ``buf`` itself (plus the temporary storage handle) holds its memory."""
    assert _USE_COUNT is not None  # without it RecycledOutputs caches nothing
    return _USE_COUNT(buf.untyped_storage()._cdata) <= 2


class RecycledOutputs:
    """A caching allocator for a few large CPU output tensors.

    :meth:`empty` returns a tensor over a cached byte buffer that nothing else references,
    the smallest that fits; otherwise a fresh huge-page buffer, cached when there is room.
    Contents are undefined, as with ``torch.empty``.

    Args:
        max_buffers: how many buffers to keep (the memory held is their total size).
        min_bytes: smaller requests bypass the cache (malloc serves them well).
    """

    def __init__(self, max_buffers: int = 4, min_bytes: int = 1 << 20) -> None:
        if max_buffers < 0:
            raise ValueError(f"RecycledOutputs: max_buffers={max_buffers} must be >= 0")
        self.max_buffers = max_buffers if _USE_COUNT is not None else 0
        self.min_bytes = min_bytes
        self._buffers: list[torch.Tensor] = []  # uint8 (capacity,)
        self.hits = 0
        self.misses = 0

    def empty(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        nbytes = math.prod(shape) * dtype.itemsize
        if nbytes < self.min_bytes or self.max_buffers == 0:
            return empty_hugepages(shape, dtype)
        in_use = [b for b in self._buffers if not _unused(b)]
        fits = [b for b in self._buffers if b.numel() >= nbytes and not any(b is u for u in in_use)]
        if fits:
            self.hits += 1
            buf = min(fits, key=torch.Tensor.numel)
        else:
            self.misses += 1
            self._buffers = in_use  # the unused ones are all too small: they would only hold memory
            buf = empty_hugepages((nbytes,), torch.uint8)
            if len(self._buffers) < self.max_buffers:
                self._buffers.append(buf)
        return buf[:nbytes].view(dtype).view(shape)

    def cached_bytes(self) -> int:
        return sum(b.numel() for b in self._buffers)

    def clear(self) -> None:
        """Forget every cached buffer (tensors handed out stay valid)."""
        self._buffers.clear()
