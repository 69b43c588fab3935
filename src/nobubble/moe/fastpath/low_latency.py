"""Low-latency mode (decoding): fixed-capacity buffers, expert-major output, no count exchange.

One row travels per (token, expert) pair into a fixed slot per (source rank, local expert);
the counts travel at the end of each source's slot. Output:

- ``recv_x [L, R * T, H]``: rows for local expert ``e`` from source rank ``i`` sit at
  ``[e, i * T : i * T + recv_layout[e, i]]`` in the source's token order; the rest is padding;
- ``recv_count [L]``: valid rows per local expert.

Combine returns ``sum_k topk_weights[n, k] * out(n, k)`` (float32, slot order). With
``return_recv_hook=True`` dispatch only sends; the caller calls the hook to receive, with no
other call on the buffer in between. The transport's
:class:`~nobubble.moe.transport.Capabilities` choose how rows move (``peer_writes``: only valid
rows; ``split_all_to_all``: whole slots, asynchronously; else at once). See
``docs/moe/fastpath.md``.

Shape legend: ``N`` tokens (``<= T``), ``H`` hidden, ``K`` top-k, ``E`` experts, ``R`` ranks,
``L = E / R`` local experts, ``T = num_max_dispatch_tokens_per_rank``, ``C = T * min(K, L)``
rows per source slot.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

import torch

import nobubble.moe.fastpath.cpu_kernels as cpu_kernels
from nobubble.moe.fastpath.fp8 import dequantize_rows, fp8_row_bytes, quantize_rows
from nobubble.moe.layout import check_topk_idx, num_local_experts
from nobubble.moe.transport import PeerWrites, Transport, TransportError, capabilities_of

__all__ = ["LowLatencyMode", "LowLatencyHandle", "LowLatencyDispatch"]


def _sort_pairs(topk_idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Valid (token, slot, expert) pairs of ``topk_idx [N, K]``, ``[P]`` each, sorted by
    expert then token - i.e. by destination rank, local expert, token."""
    num_tokens, topk = topk_idx.shape
    dev = topk_idx.device
    token = torch.arange(num_tokens, device=dev).repeat_interleave(topk)  # (N*K,)
    slot = torch.arange(topk, device=dev).repeat(num_tokens)  # (N*K,)
    expert = topk_idx.reshape(-1).long()
    valid = expert >= 0
    token, slot, expert = token[valid], slot[valid], expert[valid]
    order = torch.argsort(expert * (num_tokens + 1) + token, stable=True)
    return token[order], slot[order], expert[order]


@dataclass(frozen=True)
class _SlotLayout:
    """One source's slot: ``cap_rows`` rows of ``row_bytes``, then ``[L]`` int64 counts at
    ``counts_at`` (16-byte aligned), ``slot_bytes`` in all."""

    cap_rows: int
    row_bytes: int
    num_local_experts: int
    counts_at: int
    slot_bytes: int

    @staticmethod
    def make(cap_rows: int, row_bytes: int, num_local_experts: int) -> _SlotLayout:
        counts_at = -(-cap_rows * row_bytes // 16) * 16
        slot_bytes = -(-(counts_at + 8 * num_local_experts) // 16) * 16
        return _SlotLayout(cap_rows, row_bytes, num_local_experts, counts_at, slot_bytes)

    def counts(self, slot: torch.Tensor) -> torch.Tensor:
        """The ``[L]`` int64 counts inside a flat uint8 slot (a view)."""
        return slot[self.counts_at : self.counts_at + 8 * self.num_local_experts].view(torch.int64)


@dataclass(frozen=True, eq=False)
class LowLatencyHandle:
    """What combine needs to send expert outputs home and weight them.

    Attributes:
        num_tokens: ``N`` of this rank.
        hidden: ``H``.
        send_token / send_slot: ``[P]`` int64, the (token, top-k slot) of each pair sent, by
            destination rank, then local expert, then token.
        send_counts: ``R`` ints, pairs sent to each rank.
        recv_layout: ``[L, R]`` int64, rows received per (local expert, source rank); -1 until
            that source's rows have arrived (the receive, or the hook, fills it).
        topk: ``K`` of the dispatch (combine must pass the same routing).
        max_tokens: ``T`` of the dispatch; num_experts: its ``E``.
    """

    num_tokens: int
    hidden: int
    send_token: torch.Tensor
    send_slot: torch.Tensor
    send_counts: tuple[int, ...]
    recv_layout: torch.Tensor
    topk: int
    max_tokens: int
    num_experts: int

    def received(self) -> bool:
        """Whether every source's rows have arrived (after the receive or the hook)."""
        return not bool((self.recv_layout < 0).any())


@dataclass(frozen=True, eq=False)
class LowLatencyDispatch:
    """What :meth:`~nobubble.moe.buffer.Buffer.low_latency_dispatch` returns.

    Attributes:
        recv_x: ``[L, R * T, H]`` expert-major rows (x's dtype; dequantised with FP8); a view
            of the buffer's receive memory, valid until the next dispatch.
        recv_count: ``[L]`` int64 valid rows per local expert.
        handle: for :meth:`~nobubble.moe.buffer.Buffer.low_latency_combine`.
        hook: with ``return_recv_hook``, call it to receive (fills ``recv_x``, ``recv_count``
            and ``handle.recv_layout``); None when the receive already happened.
    """

    recv_x: torch.Tensor
    recv_count: torch.Tensor
    handle: LowLatencyHandle
    hook: Callable[[], None] | None


class LowLatencyMode:
    """Fixed-capacity dispatch / combine for small batches over one transport.

    Args:
        transport: the buffer's transport (its capabilities choose how rows move).
        num_experts: ``E``, a multiple of the group size.

    Lifecycle: ``IDLE -> (dispatch with return_recv_hook) PENDING -> (hook) IDLE``; while a
    receive is pending, every other call on the transport is refused (:meth:`check_idle`),
    since it would reuse the slots the pending rows sit in.
    """

    def __init__(self, transport: Transport, num_experts: int) -> None:
        self.transport = transport
        self.rank, self.num_ranks = transport.rank, transport.world_size
        self.num_local_experts = num_local_experts(num_experts, self.num_ranks)
        self.num_experts = num_experts
        self._pending = False
        self._recv_x: dict[tuple, torch.Tensor] = {}  # allocated once per (dtype, device, T, H)

    def check_idle(self, op: str) -> None:
        """Refuse ``op`` while a dispatch's receive hook has not been called."""
        if self._pending:
            raise ValueError(
                f"{op}: a low_latency_dispatch(return_recv_hook=True) has not received yet; "
                "call its result's hook() first"
            )

    def _recv_buffer(
        self, dtype: torch.dtype, device: torch.device, max_tokens: int, hidden: int
    ) -> torch.Tensor:
        """``[L, R * T, H]``, allocated on first use and reused: a dispatch's ``recv_x`` is
        valid until the next dispatch of the same dtype (as in DeepEP's low-latency mode)."""
        key = (dtype, device, max_tokens, hidden)
        if key not in self._recv_x:
            shape = (self.num_local_experts, self.num_ranks * max_tokens, hidden)
            self._recv_x[key] = torch.empty(shape, dtype=dtype, device=device)
        return self._recv_x[key]

    # -- dispatch ---------------------------------------------------------------------------
    def dispatch(
        self,
        x: torch.Tensor,
        topk_idx: torch.Tensor,
        *,
        num_max_dispatch_tokens_per_rank: int,
        use_fp8: bool = False,
        return_recv_hook: bool = False,
    ) -> LowLatencyDispatch:
        """Send one row per (token, expert) pair into the owners' fixed-capacity slots
        (arguments as :meth:`nobubble.moe.buffer.Buffer.low_latency_dispatch`)."""
        t_max = num_max_dispatch_tokens_per_rank
        self._check_input(x, topk_idx, t_max)
        self.check_idle("low_latency_dispatch")
        num_tokens, topk = topk_idx.shape  # (N, K)
        hidden = x.shape[1]
        dev = x.device
        local, num_ranks = self.num_local_experts, self.num_ranks
        row_bytes = fp8_row_bytes(hidden) if use_fp8 else hidden * x.element_size()
        payload = quantize_rows(x) if use_fp8 else x.contiguous()
        payload = payload.view(torch.uint8).view(num_tokens, row_bytes)  # (N, row_bytes)

        token, slot, expert = _sort_pairs(topk_idx)
        send_counts = torch.bincount(expert // local, minlength=num_ranks)  # (R,)
        per_expert = torch.bincount(expert, minlength=self.num_experts).view(num_ranks, local)
        lay = _SlotLayout.make(t_max * min(topk, local), row_bytes, local)
        handle = LowLatencyHandle(
            num_tokens=num_tokens,
            hidden=hidden,
            send_token=token,
            send_slot=slot,
            send_counts=tuple(int(c) for c in send_counts.tolist()),
            recv_layout=torch.full((local, num_ranks), -1, dtype=torch.int64, device=dev),
            topk=topk,
            max_tokens=t_max,
            num_experts=self.num_experts,
        )
        recv_x = self._recv_buffer(x.dtype, dev, t_max, hidden)
        recv_count = torch.zeros(local, dtype=torch.int64, device=dev)
        offs = [0, *torch.cumsum(send_counts, 0).tolist()]

        def fill(j: int, dst: torch.Tensor) -> None:
            rows = token[offs[j] : offs[j + 1]]
            out = dst[: rows.shape[0] * row_bytes].view(rows.shape[0], row_bytes)
            torch.index_select(payload, 0, rows, out=out)
            lay.counts(dst).copy_(per_expert[j])

        receive = self._send(fill, lay.slot_bytes, send_counts, row_bytes, dev)

        def place(i: int, slot_data: torch.Tensor) -> None:
            counts = lay.counts(slot_data)  # (L,)
            total = int(counts.sum())
            if total > lay.cap_rows or bool((counts < 0).any()):
                raise TransportError(f"low_latency_dispatch: corrupt counts {counts.tolist()}")
            rows = slot_data[: total * row_bytes].view(total, row_bytes)
            if use_fp8:
                values = dequantize_rows(rows, hidden, x.dtype)
            else:
                values = rows.view(x.dtype).view(total, hidden)
            e_ids = torch.repeat_interleave(torch.arange(local, device=dev), counts)  # (total,)
            j = torch.arange(total, device=dev) - (torch.cumsum(counts, 0) - counts)[e_ids]
            dst = e_ids * (num_ranks * t_max) + i * t_max + j  # row in [L * R * T]
            recv_x.view(local * num_ranks * t_max, hidden).index_copy_(0, dst, values)
            handle.recv_layout[:, i] = counts
            recv_count.add_(counts)

        def hook() -> None:
            self._pending = False
            receive(place)

        self._pending = True
        if return_recv_hook:
            return LowLatencyDispatch(recv_x, recv_count, handle, hook)
        hook()
        return LowLatencyDispatch(recv_x, recv_count, handle, None)

    def _send(
        self,
        fill: Callable[[int, torch.Tensor], None],
        slot_bytes: int,
        send_counts: torch.Tensor,
        row_bytes: int,
        dev: torch.device,
    ) -> Callable[[Callable[[int, torch.Tensor], None]], None]:
        """Write every destination's slot; return ``receive(place)`` that hands each source's
        slot to ``place(source, slot)``."""
        me, num_ranks = self.rank, self.num_ranks
        own = torch.empty(slot_bytes, dtype=torch.uint8, device=dev)
        fill(me, own)
        caps = capabilities_of(self.transport)
        if caps.peer_writes:
            shm = cast(PeerWrites, self.transport)
            step = shm.begin([slot_bytes] * num_ranks, kind="ll_dispatch")
            for j in shm.peers():
                shm.write_peer(j, step, slot_bytes, functools.partial(fill, j), kind="ll_dispatch")
            remote = (int(send_counts.sum()) - int(send_counts[me])) * row_bytes
            shm.count_bytes("ll_dispatch", sent=remote, remote=remote, received=0)

            def receive(place) -> None:
                place(me, own)
                for i, data in shm.poll_slots(step, [slot_bytes] * num_ranks, kind="ll_dispatch"):
                    place(i, data)

            return receive
        send = torch.empty(num_ranks, slot_bytes, dtype=torch.uint8, device=dev)  # (R, bytes)
        for j in range(num_ranks):
            if j == me:
                send[j].copy_(own)
            else:
                fill(j, send[j])
        ones = [1] * num_ranks  # fixed-size slots move whole
        finish: Callable[[], torch.Tensor]
        if caps.split_all_to_all:
            finish = cast(Any, self.transport).all_to_all_start(
                send, ones, ones, kind="ll_dispatch"
            )
        else:
            recv = self.transport.all_to_all(send, ones, ones, kind="ll_dispatch")
            finish = lambda: recv  # noqa: E731 - moved already; the hook only places

        def receive_all(place) -> None:
            recv = finish()  # (R, bytes)
            for i in range(num_ranks):
                place(i, recv[i])

        return receive_all

    def _check_input(self, x: torch.Tensor, topk_idx: torch.Tensor, max_tokens: int) -> None:
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
            raise ValueError(
                f"low_latency_dispatch: num_max_dispatch_tokens_per_rank={max_tokens!r} must be "
                "an int >= 1"
            )
        if not isinstance(x, torch.Tensor) or x.dim() != 2:
            shape = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
            raise ValueError(f"low_latency_dispatch: x must be [N, hidden], got {shape}")
        if not x.is_floating_point():
            raise ValueError(f"low_latency_dispatch: x.dtype={x.dtype}; use bf16 or fp32")
        check_topk_idx(topk_idx, self.num_experts)
        if topk_idx.shape[0] != x.shape[0]:
            raise ValueError(
                f"low_latency_dispatch: topk_idx has {topk_idx.shape[0]} rows, x {x.shape[0]}"
            )
        if x.shape[0] > max_tokens:
            raise ValueError(
                f"low_latency_dispatch: {x.shape[0]} tokens exceed "
                f"num_max_dispatch_tokens_per_rank={max_tokens}; raise it or split the batch"
            )

    # -- combine ----------------------------------------------------------------------------
    def combine(
        self,
        x: torch.Tensor,
        topk_idx: torch.Tensor,
        topk_weights: torch.Tensor,
        handle: LowLatencyHandle,
    ) -> torch.Tensor:
        """``sum_k topk_weights[n, k] * x_out(n, k)`` for this rank's tokens (arguments as
        :meth:`nobubble.moe.buffer.Buffer.low_latency_combine`)."""
        self._check_combine_args(x, topk_idx, topk_weights, handle)
        local, num_ranks, t_max, h = (
            self.num_local_experts,
            self.num_ranks,
            handle.max_tokens,
            handle.hidden,
        )
        layout = handle.recv_layout  # (L, R)
        # rows going back to source i: experts in order, each expert's block for i
        dev = layout.device
        e_ids = torch.arange(local, device=dev).repeat(num_ranks)
        e_ids = e_ids.repeat_interleave(layout.t().reshape(-1))  # by (source, expert)
        first = torch.cumsum(layout.t().reshape(-1), 0) - layout.t().reshape(-1)
        src_ids = torch.arange(num_ranks, device=dev).repeat_interleave(layout.sum(dim=0))
        j = torch.arange(e_ids.shape[0], device=dev) - first[src_ids * local + e_ids]
        pos = e_ids * (num_ranks * t_max) + src_ids * t_max + j  # (sum, )
        x_rows = x.reshape(local * num_ranks * t_max, h)  # (L * R * T, H)
        back_counts = layout.sum(dim=0).tolist()  # rows going back to each source
        weights = topk_weights.float().masked_fill(topk_idx < 0, 0.0).contiguous()  # (N, K)
        num_tokens, topk = topk_idx.shape
        out = torch.empty(num_tokens, h, dtype=x.dtype, device=x.device)  # (N, H)
        slot_of = handle.send_token * topk + handle.send_slot  # (P,) flat (token, slot)
        if capabilities_of(self.transport).peer_writes and self._combine_in_place(
            x_rows, pos, back_counts, handle, slot_of, weights, out
        ):
            return out
        send = x_rows.index_select(0, pos)  # (rows back, H)
        back = self.transport.all_to_all(
            send, back_counts, list(handle.send_counts), kind="ll_combine"
        )  # (P, H) aligned with (send_token, send_slot)
        row_of = torch.full((num_tokens * topk,), -1, dtype=torch.int64, device=x.device)
        row_of[slot_of] = torch.arange(back.shape[0], device=x.device)
        if cpu_kernels.weighted_combine(
            back.contiguous(), row_of.view(num_tokens, topk), weights, out
        ):
            return out
        out = torch.zeros(handle.num_tokens, h, device=x.device)  # (N, H) float32
        for k in range(topk_idx.shape[1]):  # slot order; a token has one row per slot
            rows = (handle.send_slot == k).nonzero().view(-1)
            tokens = handle.send_token[rows]
            contrib = weights[tokens, k].view(-1, 1) * back[rows].float()  # (n_k, H)
            out.index_add_(0, tokens, contrib)
        return out.to(x.dtype)

    def _check_combine_args(
        self,
        x: torch.Tensor,
        topk_idx: torch.Tensor,
        topk_weights: torch.Tensor,
        handle: LowLatencyHandle,
    ) -> None:
        """Refuse a combine whose shapes are not the dispatch's, or whose rows have not arrived."""
        if not isinstance(handle, LowLatencyHandle):
            raise ValueError(
                f"low_latency_combine: handle is {type(handle).__name__}; pass the handle of a "
                "low_latency_dispatch result"
            )
        local, num_ranks, t_max, h = (
            self.num_local_experts,
            self.num_ranks,
            handle.max_tokens,
            handle.hidden,
        )
        if x.shape != (local, num_ranks * t_max, h):
            raise ValueError(
                f"low_latency_combine: x must be [{local}, {num_ranks * t_max}, {h}] (recv_x's "
                f"layout), got {tuple(x.shape)}"
            )
        if topk_weights.shape != topk_idx.shape or tuple(topk_idx.shape) != (
            handle.num_tokens,
            handle.topk,
        ):
            raise ValueError(
                f"low_latency_combine: topk_idx {tuple(topk_idx.shape)} and topk_weights "
                f"{tuple(topk_weights.shape)} must both be [{handle.num_tokens}, {handle.topk}], "
                "the dispatch's routing"
            )
        if not handle.received():
            raise ValueError(
                "low_latency_combine: the dispatch's rows have not all arrived; call the "
                "dispatch result's hook() (return_recv_hook=True) before combining"
            )

    def _combine_in_place(
        self,
        x_rows: torch.Tensor,
        pos: torch.Tensor,
        back_counts: list[int],
        handle: LowLatencyHandle,
        slot_of: torch.Tensor,
        weights: torch.Tensor,
        out: torch.Tensor,
    ) -> bool:
        """Shared-memory combine without intermediate copies: each expert rank gathers its
        rows straight into the source's slot, and the source sums them where they arrived
        (the weighted-combine kernel reads the slots by address). ``False`` where the kernel
        does not cover the case; nothing has moved then."""
        if cpu_kernels.load() is None or out.dtype not in cpu_kernels.KERNEL_DTYPES:
            return False
        if x_rows.dtype != out.dtype or not x_rows.is_contiguous() or x_rows.device.type != "cpu":
            return False
        if back_counts[self.rank] != handle.send_counts[self.rank]:  # before any peer waits
            raise TransportError(
                f"low_latency_combine: rank {self.rank} holds {back_counts[self.rank]} rows for "
                f"itself but sent itself {handle.send_counts[self.rank]}; the handle does not "
                "belong to this buffer's last dispatch"
            )
        shm = cast(PeerWrites, self.transport)
        me, h = self.rank, handle.hidden
        row_bytes = h * x_rows.element_size()
        send_off = [0, *torch.cumsum(torch.tensor(back_counts), 0).tolist()]
        home = list(handle.send_counts)  # rows coming home from each expert rank
        home_off = [0, *torch.cumsum(torch.tensor(home), 0).tolist()]
        recv_nbytes = [n * row_bytes for n in home]
        step = shm.begin(recv_nbytes, kind="ll_combine")
        writes = {}
        for j in shm.peers():
            idx = pos[send_off[j] : send_off[j + 1]]

            def fill(slot: torch.Tensor, idx: torch.Tensor = idx) -> None:
                dst = slot.view(x_rows.dtype).view(idx.shape[0], h)  # (n_j, H)
                torch.index_select(x_rows, 0, idx, out=dst)

            writes[j] = (idx.shape[0] * row_bytes, fill)
        held = {me: x_rows.index_select(0, pos[send_off[me] : send_off[me + 1]])}  # (n_me, H)
        shm.exchange(step, writes, recv_nbytes, held.__setitem__, kind="ll_combine")
        # address of every row that came home, in handle order (source-major)
        addr = torch.empty(home_off[-1], dtype=torch.int64)  # (P,)
        for i, rows in held.items():
            n_i = home_off[i + 1] - home_off[i]
            addr[home_off[i] : home_off[i + 1]] = rows.data_ptr() + torch.arange(n_i) * row_bytes
        row_addr = torch.zeros(weights.numel(), dtype=torch.int64)
        row_addr[slot_of] = addr
        if not cpu_kernels.weighted_combine_at(
            row_addr.view(weights.shape), weights, out, keep_alive=held
        ):
            raise RuntimeError("low_latency_combine: the CPU kernel declined checked inputs")
        remote = (send_off[-1] - back_counts[me]) * row_bytes
        shm.count_bytes(
            "ll_combine",
            sent=send_off[-1] * row_bytes,
            remote=remote,
            received=home_off[-1] * row_bytes,
        )
        return True
