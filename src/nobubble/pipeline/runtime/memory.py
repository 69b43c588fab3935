"""Activation memory a rank holds, measured from the tensors autograd and W actually keep.

During a stage's forward, a ``saved_tensors_hooks`` pack hook sees every tensor autograd saves
for the backward; their distinct storages (parameters excluded) are the microbatch's
activation bytes. Between B and W the stage's :class:`WeightGradStore` holds (X, dY) per
linear; their bytes are read from the store. The meter adds and removes these as F, B and W
run and keeps the peak: the measured peak activation memory of the rank, the same on every
device (on CUDA the executor also reports ``torch.cuda.max_memory_allocated``).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn

__all__ = ["ActivationMeter"]


class ActivationMeter:
    """Live and peak activation bytes of one rank over its stages and microbatches."""

    def __init__(self, modules: nn.Module | list[nn.Module]) -> None:
        mods = modules if isinstance(modules, list) else [modules]
        self._param_storages = {
            p.untyped_storage().data_ptr() for m in mods for p in m.parameters()
        }
        self._held: dict[tuple[int, int, str], int] = {}
        self.live_bytes = 0
        self.peak_bytes = 0

    def reset_peak(self) -> None:
        self.peak_bytes = self.live_bytes

    @contextmanager
    def forward(self, stage: int, microbatch: int) -> Iterator[None]:
        """Count the bytes autograd saves inside this block as (stage, microbatch)'s F memory."""
        seen: dict[int, int] = {}

        def pack(t: torch.Tensor) -> torch.Tensor:
            storage = t.untyped_storage()
            ptr = storage.data_ptr()
            if ptr not in self._param_storages:
                seen[ptr] = storage.nbytes()
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            yield
        self._hold((stage, microbatch, "F"), sum(seen.values()))

    def backward_input(self, stage: int, microbatch: int, stash_bytes: int) -> None:
        """B freed the graph of (stage, microbatch) and keeps ``stash_bytes`` for W."""
        self._release((stage, microbatch, "F"))
        self._hold((stage, microbatch, "W"), stash_bytes)

    def backward_weight(self, stage: int, microbatch: int) -> None:
        self._release((stage, microbatch, "W"))

    def _hold(self, key: tuple[int, int, str], nbytes: int) -> None:
        self._held[key] = nbytes
        self.live_bytes += nbytes
        self.peak_bytes = max(self.peak_bytes, self.live_bytes)

    def _release(self, key: tuple[int, int, str]) -> None:
        self.live_bytes -= self._held.pop(key, 0)
