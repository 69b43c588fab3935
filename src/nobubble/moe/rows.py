"""How a :class:`~nobubble.moe.buffer.Buffer` moves payload rows once the handle is known.

Every row mover has the same two methods (:class:`RowMover`): ``dispatch_rows`` sends
``[N, *]`` token rows to the ranks in the handle's layout and returns the ``[M, *]`` rows
received, grouped by source rank, token order within; ``combine_rows`` sends ``[M, *]`` rows
back and returns their per-token sums ``[N, *]``, sources added in rank order (float32 for
16-bit rows). :class:`CollectiveRows` does it with the transport's ``all_to_all`` - any
transport; the fast paths (:mod:`nobubble.moe.fastpath.shm_rows`,
:mod:`nobubble.moe.fastpath.hierarchical`) do it faster with the same result.
"""

from __future__ import annotations

import math
from typing import Protocol

import torch

from nobubble.moe.handle import DispatchHandle
from nobubble.moe.masking import MaskLedger
from nobubble.moe.transport import Transport

__all__ = ["RowMover", "CollectiveRows"]


class RowMover(Protocol):
    """The payload step of dispatch and combine for one handle."""

    def dispatch_rows(self, t: torch.Tensor, handle: DispatchHandle, *, kind: str) -> torch.Tensor:
        """``[N, *]`` -> ``[M, *]``."""
        ...

    def combine_rows(self, t: torch.Tensor, handle: DispatchHandle, *, kind: str) -> torch.Tensor:
        """``[M, *]`` -> ``[N, *]``."""
        ...


class CollectiveRows:
    """Row movers over the transport's ``all_to_all`` (any transport; the only path that goes
    on without masked ranks)."""

    def __init__(self, transport: Transport, mask: MaskLedger, combine_chunk_bytes: int) -> None:
        self.transport = transport
        self._mask = mask
        self.combine_chunk_bytes = combine_chunk_bytes

    def dispatch_rows(self, t: torch.Tensor, handle: DispatchHandle, *, kind: str) -> torch.Tensor:
        send = t.index_select(0, handle.send_token_idx)  # (S, *)
        return self.transport.all_to_all(
            send, handle.num_send_tokens_per_rank, handle.num_recv_tokens_per_rank, kind=kind
        )

    def combine_rows(self, t: torch.Tensor, handle: DispatchHandle, *, kind: str) -> torch.Tensor:
        """``[M, *]`` -> ``[N, *]``: return rows to their source ranks and sum them per token.

        Sums run in source-rank order, in float32 for 16-bit inputs, then cast back to t's
        dtype; within one source rank's segment the token indices are distinct, so the result
        is deterministic on every device. 16-bit rows are widened a few MiB at a time into one
        scratch buffer on CPU (about twice as fast as widening whole segments).
        """
        back = self.transport.all_to_all(
            t, handle.num_recv_tokens_per_rank, handle.num_send_tokens_per_rank, kind=kind
        )  # (S, *) in send order; rows of masked sources read as zeros
        self._mask.note_missing_rows(kind)
        widen = t.is_floating_point() and t.element_size() < 4
        acc_dtype = torch.float32 if widen else t.dtype
        out = torch.zeros((handle.num_tokens, *t.shape[1:]), dtype=acc_dtype, device=t.device)
        chunk, scratch = max(1, back.shape[0]), None
        if widen and t.device.type == "cpu":  # on GPU one widening kernel per segment is best
            chunk = max(1, self.combine_chunk_bytes // (4 * max(1, math.prod(t.shape[1:]))))
            scratch = torch.empty((min(chunk, back.shape[0]), *t.shape[1:]), dtype=acc_dtype)
        start = 0
        for count in handle.num_send_tokens_per_rank:
            for lo in range(start, start + count, chunk):
                hi = min(start + count, lo + chunk)
                rows = back[lo:hi]
                if scratch is not None:
                    rows = scratch[: hi - lo].copy_(rows)
                elif widen:
                    rows = rows.to(acc_dtype)
                out.index_add_(0, handle.send_token_idx[lo:hi], rows)
            start += count
        return out.to(t.dtype)
