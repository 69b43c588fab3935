"""B/W split of a linear layer: input-gradient backward now (B), weight-gradient backward
later (W), with one store per stage (no class-level state).

A stage runs each forward inside ``store.recording(microbatch)``; its linears call
:func:`deferred_linear`. B (autograd backward on the stage output) computes only ``dX = dY W``
per linear and hands ``(X, dY)`` to the store; W = ``store.flush(microbatch)`` accumulates
``dW = dY^T X`` and ``db = sum(dY)`` into ``.grad``; nothing of B is recomputed. Memory
between B and W: per linear its input X and its output gradient dY.

Store lifecycle per microbatch: ``RECORDING`` (inside ``recording(m)``, F) -> ``PENDING``
(after B put its (X, dY) pairs) -> flushed (W; the store holds nothing of ``m``).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["WeightGradStore", "deferred_linear", "weight_grad"]


@dataclass(frozen=True)
class _PendingGrad:
    """One linear's deferred weight gradient: input X (..., in), output grad dY (..., out)."""

    weight: nn.Parameter
    bias: nn.Parameter | None
    x: torch.Tensor
    dy: torch.Tensor


def weight_grad(x: torch.Tensor, dy: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``dW = dY^T X`` (out, in) and ``db = sum(dY)`` (out,) over all leading dims."""
    x2 = x.reshape(-1, x.shape[-1])  # (N, in)
    dy2 = dy.reshape(-1, dy.shape[-1])  # (N, out)
    return dy2.t().mm(x2), dy2.sum(0)


def _accumulate(param: nn.Parameter, grad: torch.Tensor) -> None:
    if param.grad is None:
        param.grad = grad
    else:
        param.grad.add_(grad)


class WeightGradStore:
    """Deferred weight-gradient work of one pipeline stage, keyed by microbatch."""

    def __init__(self) -> None:
        self._pending: dict[int, list[_PendingGrad]] = {}
        self._closed: set[int] = set()  # microbatches whose B is done
        self._recording: int | None = None

    @contextmanager
    def recording(self, microbatch: int) -> Iterator[None]:
        """Run a forward whose linear layers defer their weight gradient to ``flush(microbatch)``."""
        if self._recording is not None:
            raise RuntimeError(
                f"forward of microbatch {microbatch} started inside that of {self._recording}"
            )
        self._recording = microbatch
        try:
            yield
        finally:
            self._recording = None

    @property
    def recording_microbatch(self) -> int | None:
        return self._recording

    def put(self, microbatch: int, pending: _PendingGrad) -> None:
        """Keep one linear's (X, dY) for W. Ignored once B of ``microbatch`` is done: a
        backward that walks the graph again in W must not defer the same product twice."""
        if microbatch not in self._closed:
            self._pending.setdefault(microbatch, []).append(pending)

    def close_backward(self, microbatch: int) -> None:
        """Mark B of ``microbatch`` done, so W may run even if no linear deferred anything."""
        self._pending.setdefault(microbatch, [])
        self._closed.add(microbatch)

    def deferred_params(self, microbatch: int) -> list[nn.Parameter]:
        """The parameters whose gradient for ``microbatch`` waits in the store."""
        out: list[nn.Parameter] = []
        for p in self._pending.get(microbatch, ()):
            out.append(p.weight)
            if p.bias is not None:
                out.append(p.bias)
        return out

    def pending_flops(self, microbatch: int) -> int:
        """FLOPs of the pending ``dW = dY^T X`` products of ``microbatch`` (2 * rows * in * out)."""
        return sum(2 * p.x.numel() * p.dy.shape[-1] for p in self._pending.get(microbatch, ()))

    def has_pending(self, microbatch: int) -> bool:
        return microbatch in self._pending

    @property
    def pending_microbatches(self) -> tuple[int, ...]:
        return tuple(sorted(self._pending))

    def flush(self, microbatch: int) -> int:
        """Compute and accumulate the weight gradients of ``microbatch``; returns how many.

        Raises RuntimeError when B of ``microbatch`` has not run (nothing is pending).
        """
        pending = self._pending.pop(microbatch, None)
        self._closed.discard(microbatch)
        if pending is None:
            raise RuntimeError(
                f"W of microbatch {microbatch} before its B: no weight gradients are pending"
            )
        with torch.no_grad():
            for p in pending:
                dw, db = weight_grad(p.x, p.dy)
                _accumulate(p.weight, dw)
                if p.bias is not None:
                    _accumulate(p.bias, db)
        return len(pending)


class _DeferredLinear(torch.autograd.Function):
    """``F.linear`` whose backward returns only dX and leaves (X, dY) in a store."""

    @staticmethod
    def forward(ctx, x, weight, bias, store, microbatch, anchor):
        # The parameters ride on ctx as themselves: a saved tensor may come back from
        # saved-tensor hooks as another Python object, and W must accumulate into the leaf.
        ctx.save_for_backward(x)
        ctx.weight, ctx.bias = weight, bias
        ctx.store = store
        ctx.microbatch = microbatch
        ctx.anchor_shape = None if anchor is None else anchor.shape
        return F.linear(x, weight, bias)

    @staticmethod
    def backward(ctx, dy):
        (x,) = ctx.saved_tensors
        weight = ctx.weight
        dx = dy.matmul(weight) if ctx.needs_input_grad[0] else None  # (..., in)
        if ctx.needs_input_grad[1]:
            ctx.store.put(ctx.microbatch, _PendingGrad(weight, ctx.bias, x, dy))
        anchor_grad = None if ctx.anchor_shape is None else dy.new_zeros(ctx.anchor_shape)
        return dx, None, None, None, None, anchor_grad


def deferred_linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    store: WeightGradStore,
    microbatch: int,
    *,
    anchor: torch.Tensor | None = None,
) -> torch.Tensor:
    """``F.linear(x, weight, bias)`` whose backward computes dX and leaves (X, dY) in
    ``store`` for W. ``anchor``: an extra input that needs a gradient, so that a backward
    asked for the anchor's gradient runs this node even when ``x`` needs none."""
    return _DeferredLinear.apply(x, weight, bias, store, microbatch, anchor)
