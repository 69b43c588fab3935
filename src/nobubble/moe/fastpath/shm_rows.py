"""Row movers fused with the shared-memory writes, as DeepEP's kernels are.

:class:`ShmRows` serves a transport that declares ``Capabilities(peer_writes=True)``:
dispatch gathers the token rows straight into the peer's slot (``index_select(...,
out=<peer slot>)``); combine reduces every source's rows in one pass (the C kernel of
:mod:`nobubble.moe.fastpath.cpu_kernels`, else torch), float32 sums in source-rank order, bit
for bit the buffer's collective path. Outputs come from
:class:`~nobubble.moe.fastpath.cpu_memory.RecycledOutputs`. Layout, count exchange, handle and
autograd are the buffer's. See ``docs/moe/fastpath.md``.
"""

from __future__ import annotations

import math
from itertools import accumulate

import torch

import nobubble.moe.fastpath.cpu_kernels as cpu_kernels
from nobubble.moe.fastpath.cpu_memory import RecycledOutputs
from nobubble.moe.handle import DispatchHandle
from nobubble.moe.transport import PeerWrites

__all__ = ["ShmRows"]

_BLOCK_BYTES = 1 << 20  # float32 accumulator block of the torch combine path (fits in L2)


class ShmRows:
    """Gather-on-write dispatch and reduce-on-read combine over a peer-writing transport.

    Args:
        transport: declares ``Capabilities(peer_writes=True)`` (has :class:`PeerWrites`'s steps).
        recycle_outputs: keep up to this many large output buffers for reuse once the caller
            drops them (0: every output is a fresh allocation).
        fused_kernels: reduce combine with the compiled C kernel when it is available
            (``False``: always the torch path; the results are identical).
    """

    def __init__(self, transport: PeerWrites, *, recycle_outputs: int, fused_kernels: bool) -> None:
        self.shm = transport
        self.rank, self.num_ranks = transport.rank, transport.world_size
        self.outputs = RecycledOutputs(max_buffers=recycle_outputs)
        self.fused_kernels = fused_kernels

    def dispatch_rows(self, t: torch.Tensor, handle: DispatchHandle, *, kind: str) -> torch.Tensor:
        """``[N, *]`` -> ``[M, *]``: each sent row is gathered straight into the peer's slot."""
        t = t.contiguous()
        row_shape = t.shape[1:]
        row_bytes = _row_bytes(t)
        send_off = list(accumulate(handle.num_send_tokens_per_rank, initial=0))
        recv_off = list(accumulate(handle.num_recv_tokens_per_rank, initial=0))
        recv_nbytes = [n * row_bytes for n in handle.num_recv_tokens_per_rank]
        out = self.outputs.empty((recv_off[-1], *row_shape), t.dtype)  # (M, *)
        shm = self.shm
        step = shm.begin(recv_nbytes, kind=kind)
        writes = {}
        for j in shm.peers():
            idx = handle.send_token_idx[send_off[j] : send_off[j + 1]]

            def fill(slot: torch.Tensor, idx: torch.Tensor = idx) -> None:
                dst = slot.view(t.dtype).view(idx.shape[0], *row_shape)  # (n_j, *)
                torch.index_select(t, 0, idx, out=dst)

            writes[j] = (idx.shape[0] * row_bytes, fill)
        me = self.rank
        own_idx = handle.send_token_idx[send_off[me] : send_off[me + 1]]
        torch.index_select(t, 0, own_idx, out=out[recv_off[me] : recv_off[me + 1]])

        def copy_out(i: int, slot: torch.Tensor) -> None:
            rows = recv_off[i + 1] - recv_off[i]
            out[recv_off[i] : recv_off[i + 1]].copy_(slot.view(t.dtype).view(rows, *row_shape))

        shm.exchange(step, writes, recv_nbytes, copy_out, kind=kind)
        sent = send_off[-1] * row_bytes
        own = (send_off[me + 1] - send_off[me]) * row_bytes
        shm.count_bytes(kind, sent=sent, remote=sent - own, received=recv_off[-1] * row_bytes)
        return out

    def combine_rows(self, t: torch.Tensor, handle: DispatchHandle, *, kind: str) -> torch.Tensor:
        """``[M, *]`` -> ``[N, *]``: rows go home through shared memory and are summed per token
        in source-rank order (float32 for 16-bit inputs), block by block of tokens."""
        t = t.contiguous()
        row_shape = t.shape[1:]
        row_bytes = _row_bytes(t)
        flat = t.view(-1).view(torch.uint8)  # (M * row_bytes,)
        # rows of t by destination; rows coming home by source
        back_off = list(accumulate(handle.num_recv_tokens_per_rank, initial=0))
        home_off = list(accumulate(handle.num_send_tokens_per_rank, initial=0))
        recv_nbytes = [n * row_bytes for n in handle.num_send_tokens_per_rank]
        shm = self.shm
        step = shm.begin(recv_nbytes, kind=kind)
        writes = {}
        for j in shm.peers():
            seg = flat[back_off[j] * row_bytes : back_off[j + 1] * row_bytes]
            writes[j] = (seg.numel(), lambda slot, seg=seg: slot.copy_(seg))
        me = self.rank
        rows: dict[int, torch.Tensor] = {me: t[back_off[me] : back_off[me + 1]]}

        def keep(i: int, slot: torch.Tensor) -> None:
            rows[i] = slot.view(t.dtype).view(home_off[i + 1] - home_off[i], *row_shape)

        shm.exchange(step, writes, recv_nbytes, keep, kind=kind)
        out = self._reduce_blocks(t, handle, rows, home_off)
        sent = back_off[-1] * row_bytes
        own = (back_off[me + 1] - back_off[me]) * row_bytes
        shm.count_bytes(kind, sent=sent, remote=sent - own, received=home_off[-1] * row_bytes)
        return out

    def _reduce_blocks(
        self,
        t: torch.Tensor,
        handle: DispatchHandle,
        rows: dict[int, torch.Tensor],
        home_off: list[int],
    ) -> torch.Tensor:
        """Sum the rows of every source per token: ``out[n] = sum_r rows[r][token == n]``."""
        row_shape = t.shape[1:]
        num_tokens = handle.num_tokens
        out = self.outputs.empty((num_tokens, *row_shape), t.dtype)  # (N, *)
        sources = [
            handle.send_token_idx[home_off[r] : home_off[r + 1]] for r in range(self.num_ranks)
        ]
        if self.fused_kernels and cpu_kernels.combine_reduce(
            [rows[r] for r in range(self.num_ranks)], sources, num_tokens, out
        ):
            return out
        acc_dtype = torch.float32 if t.element_size() < 4 and t.is_floating_point() else t.dtype
        row_numel = max(1, _row_bytes(t) // t.element_size())
        block = max(1, _BLOCK_BYTES // (4 * row_numel))
        acc = torch.empty((min(block, max(num_tokens, 1)), *row_shape), dtype=acc_dtype)
        starts = torch.arange(0, num_tokens + block, block)  # block boundaries (last >= N)
        bounds = {}
        for r, idx in enumerate(sources):  # sorted tokens
            bounds[r] = (idx, torch.searchsorted(idx, starts).tolist())
        for b in range(len(starts) - 1):
            lo_tok, hi_tok = int(starts[b]), min(int(starts[b + 1]), num_tokens)
            if lo_tok >= hi_tok:
                break
            a = acc[: hi_tok - lo_tok]
            a.zero_()
            for r in range(self.num_ranks):  # rank order, as the buffer's collective path
                idx, cut = bounds[r]
                lo, hi = cut[b], cut[b + 1]
                if hi > lo:
                    a.index_add_(0, idx[lo:hi] - lo_tok, rows[r][lo:hi].to(acc_dtype))
            out[lo_tok:hi_tok].copy_(a)
        return out


def _row_bytes(t: torch.Tensor) -> int:
    return math.prod(t.shape[1:]) * t.element_size()
