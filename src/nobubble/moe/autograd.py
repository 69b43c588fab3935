"""Differentiable dispatch and combine.

Dispatch's backward is a combine of the gradients; combine's backward is a cached dispatch.
Top-k weights follow the same rules (gradients of slots a rank does not own are zeroed). Both
backward passes issue the same collectives on every rank, whatever ``needs_input_grad`` says.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from nobubble.moe.buffer import DispatchHandle

__all__ = ["DispatchFunction", "CombineFunction"]


class DispatchFunction(torch.autograd.Function):
    """``(x [N, H], topk_weights [N, K] | None) -> (recv_x [M, H], recv_topk_weights [M, K] | None)``.

    ``mover`` is the :class:`~nobubble.moe.buffer.Buffer` (its ``dispatch_rows`` /
    ``combine_rows``); ``handle`` the layout to follow.
    """

    @staticmethod
    def forward(
        ctx: Any,
        mover: Any,
        handle: DispatchHandle,
        x: torch.Tensor,
        topk_weights: torch.Tensor | None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        ctx.mover, ctx.handle = mover, handle
        ctx.has_weights = topk_weights is not None
        recv_x = mover.dispatch_rows(x, handle, kind="x")
        recv_topk_weights = None
        if topk_weights is not None:
            recv_topk_weights = mover.dispatch_rows(topk_weights, handle, kind="topk_weights")
            recv_topk_weights = recv_topk_weights.masked_fill(handle.recv_topk_idx < 0, 0.0)
        return recv_x, recv_topk_weights

    @staticmethod
    def backward(ctx: Any, grad_recv_x: torch.Tensor, grad_recv_weights: torch.Tensor | None):
        mover, handle = ctx.mover, ctx.handle
        grad_x = mover.combine_rows(grad_recv_x.contiguous(), handle, kind="grad_x")
        grad_weights = None
        if ctx.has_weights:
            if grad_recv_weights is None:  # pragma: no cover - materialize_grads gives zeros
                raise AssertionError("missing gradient for recv_topk_weights")
            masked = grad_recv_weights.masked_fill(handle.recv_topk_idx < 0, 0.0)
            grad_weights = mover.combine_rows(masked.contiguous(), handle, kind="grad_topk_weights")
        return None, None, grad_x, grad_weights


class CombineFunction(torch.autograd.Function):
    """``(x [M, H], topk_weights [M, K] | None) -> (combined_x [N, H], combined_weights [N, K] | None)``."""

    @staticmethod
    def forward(
        ctx: Any,
        mover: Any,
        handle: DispatchHandle,
        x: torch.Tensor,
        topk_weights: torch.Tensor | None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        ctx.mover, ctx.handle = mover, handle
        ctx.has_weights = topk_weights is not None
        combined_x = mover.combine_rows(x, handle, kind="x")
        combined_weights = None
        if topk_weights is not None:
            combined_weights = mover.combine_rows(topk_weights, handle, kind="topk_weights")
        return combined_x, combined_weights

    @staticmethod
    def backward(
        ctx: Any, grad_combined_x: torch.Tensor, grad_combined_weights: torch.Tensor | None
    ):
        mover, handle = ctx.mover, ctx.handle
        grad_x = mover.dispatch_rows(grad_combined_x.contiguous(), handle, kind="grad_x")
        grad_weights = None
        if ctx.has_weights:
            if grad_combined_weights is None:  # pragma: no cover
                raise AssertionError("missing gradient for combined_topk_weights")
            grad_weights = mover.dispatch_rows(
                grad_combined_weights.contiguous(), handle, kind="grad_topk_weights"
            )
        return None, None, grad_x, grad_weights
