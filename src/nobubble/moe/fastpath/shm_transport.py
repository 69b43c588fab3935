"""Direct intranode transport: ranks write rows straight into their peers' shared memory.

Per rank ``j`` (created once per group, named by a key that rank 0 broadcasts):

- a *control block*, int64 ``[4 + 4R]``: ``READY`` (the call number ``j`` is ready to receive),
  ``GEN``/``CAP`` (generation and per-slot capacity of the data region), ``BEAT`` (``j``'s
  heartbeat), then per source ``i``: ``DONE[i]`` (the last call whose rows ``i`` finished
  writing), ``NBYTES[i]``, ``MAPPED[i]`` (the data generation ``i`` has mapped), and per rank
  ``r``: ``VOTES[r]`` (``j`` declared ``r`` failed; :mod:`.shm_mask`);
- a *data region* of ``R * CAP`` bytes, slot ``i`` at ``[i * CAP, (i + 1) * CAP)``, grown on demand.

Call ``t`` (every rank issues the same sequence of calls): the receiver grows its region if
needed and publishes ``READY = t``; a sender waits for it, copies its rows into its slot,
writes ``NBYTES`` and then ``DONE = t``; the receiver waits for ``DONE == t``, checks
``NBYTES`` and copies the slot out. Each control word has exactly one writer (no atomics; x86
total store order). A wait past ``timeout_s`` raises
:class:`~nobubble.moe.transport.PeerFailure` naming the silent peers, or masks them
(``mask_failed_ranks=True``). The steps :meth:`ShmTransport.begin`,
:meth:`ShmTransport.write_peer`, :meth:`ShmTransport.poll_slots` and
:meth:`ShmTransport.exchange` are public for the fused paths. See ``docs/moe/fastpath.md``.
"""

from __future__ import annotations

import os
import weakref
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from nobubble.moe.fastpath.shm_mask import PeerMask
from nobubble.moe.fastpath.shm_segment import (
    Backoff,
    agree_on_key,
    barrier,
    cleanup,
    copier,
    group_hosts,
    map_segment,
    round_up,
    store_fence,
    unlink,
)
from nobubble.moe.layout import TRANSPORT_KINDS
from nobubble.moe.transport import (
    ByteCounting,
    Capabilities,
    TorchDistTransport,
    Transport,
    TransportError,
    _as_byte_rows,
    _from_byte_rows,
    check_splits,
)

__all__ = ["ShmTransport", "make_transport", "default_transport_kind", "TRANSPORT_KINDS"]

_READY, _GEN, _CAP, _BEAT, _HEADER = 0, 1, 2, 3, 4
_SHM_DIR = "/dev/shm"


class ShmTransport(ByteCounting):
    """All-to-all through shared memory between the ranks of one host.

    Args:
        group: the process group whose ranks exchange rows (``None`` = default group). All its
            ranks must run on this host; the group is used only to agree on the memory's name.
        timeout_s: the longest any wait for a peer may take.
        capacity_bytes_per_peer: initial size of each per-source slot; a call needing more
            grows the region once (to at least twice the old size).
        mask_failed_ranks: on a timeout, mark the silent peers failed (in a mask all ranks
            share) and go on without them, instead of raising; see
            :class:`~nobubble.moe.transport.FailureMasking`.
    """

    def __init__(
        self,
        group: dist.ProcessGroup | None = None,
        *,
        timeout_s: float = 120.0,
        capacity_bytes_per_peer: int = 1 << 20,
        mask_failed_ranks: bool = False,
    ) -> None:
        if capacity_bytes_per_peer < 1:
            raise ValueError(
                f"ShmTransport: capacity_bytes_per_peer={capacity_bytes_per_peer} must be >= 1"
            )
        self._join("ShmTransport", group, timeout_s)
        self.kind = "shm"
        self.mask_failed_ranks = bool(mask_failed_ranks)
        self.capabilities = Capabilities(
            peer_writes=True, masks_failed_ranks=self.mask_failed_ranks
        )
        self._closed = False
        self._seq = 0
        self._key = agree_on_key(self.group, self.rank)
        self._ctrl_t = map_segment(self._ctrl_path(self.rank), 8 * self._ctrl_len, create=True)
        self._ctrl = self._ctrl_t.numpy().view(np.int64)  # (3 + 3R,)
        self._ctrl[:] = 0
        cap = round_up(capacity_bytes_per_peer)
        self._data = map_segment(self._data_path(self.rank, 0), self.world_size * cap, create=True)
        self._ctrl[_CAP] = cap
        self._pending_unlink: list[str] = []
        self._finalizer = weakref.finalize(
            self, cleanup, [self._ctrl_path(self.rank), self._data_path(self.rank, 0)]
        )
        barrier(self.group)  # every rank's files exist
        self._peer_ctrl_t = {
            j: map_segment(self._ctrl_path(j), 8 * self._ctrl_len, create=False)
            for j in self.peers()
        }
        self._peer_ctrl = {j: t.numpy().view(np.int64) for j, t in self._peer_ctrl_t.items()}
        self._mask = PeerMask(
            self.rank,
            self.world_size,
            self._ctrl,
            self._peer_ctrl,
            beat=_BEAT,
            votes=self._vote(0),
            timeout_s=self.timeout_s,
            mask_failed_ranks=self.mask_failed_ranks,
        )
        self._peer_data: dict[int, tuple[int, torch.Tensor]] = {
            j: (0, map_segment(self._data_path(j, 0), self.world_size * cap, create=False))
            for j in self.peers()
        }
        barrier(self.group)  # every rank has mapped every peer: the names can go
        unlink(self._ctrl_path(self.rank))
        unlink(self._data_path(self.rank, 0))

    # -- setup ------------------------------------------------------------------------------
    @property
    def _ctrl_len(self) -> int:
        return _HEADER + 4 * self.world_size

    def _done(self, i: int) -> int:
        return _HEADER + i

    def _nbytes(self, i: int) -> int:
        return _HEADER + self.world_size + i

    def _mapped(self, i: int) -> int:
        return _HEADER + 2 * self.world_size + i

    def _vote(self, r: int) -> int:
        return _HEADER + 3 * self.world_size + r

    def _ctrl_path(self, rank: int) -> str:
        return os.path.join(_SHM_DIR, f"nobubble-ep-{self._key}-r{rank}-ctrl")

    def _data_path(self, rank: int, gen: int) -> str:
        return os.path.join(_SHM_DIR, f"nobubble-ep-{self._key}-r{rank}-g{gen}")

    def peers(self) -> list[int]:
        """Other ranks, starting after this one so that senders spread over receivers."""
        return [(self.rank + d) % self.world_size for d in range(1, self.world_size)]

    def close(self) -> None:
        """Release this rank's shared memory: remove its names from ``/dev/shm`` and drop its
        mappings of every segment, its own and its peers' (the pages go once no rank maps
        them). Idempotent; every later call raises ``ValueError``. A caller that closes while
        its peers still exchange leaves them waiting until their timeout."""
        self._finalizer()
        for path in self._pending_unlink:
            unlink(path)
        self._pending_unlink.clear()
        if self._closed:
            return
        self._closed = True
        # the only references to the mapped tensors (and the numpy views over them)
        del self._mask, self._ctrl, self._ctrl_t, self._data
        del self._peer_ctrl, self._peer_ctrl_t, self._peer_data

    def _check_open(self, kind: str) -> None:
        if self._closed:
            raise ValueError(
                f"ShmTransport.{kind}: the transport is closed (its shared memory is released); "
                "build a new Buffer / ShmTransport"
            )

    # -- failures ---------------------------------------------------------------------------
    def masked_ranks(self) -> frozenset[int]:
        """Ranks the group has voted failed (never shrinks; empty unless masking is on:
        every rank of a group must use the same setting)."""
        return frozenset() if self._closed else self._mask.masked_ranks()

    def missing_in_last_call(self) -> frozenset[int]:
        return frozenset() if self._closed else self._mask.missing

    # -- the steps of one exchange ----------------------------------------------------------
    def begin(self, recv_nbytes: Sequence[int], *, kind: str) -> int:
        """Start call ``t``: make room for ``recv_nbytes[i]`` bytes from each source ``i`` and
        publish READY (this rank has consumed the previous call). Returns ``t``."""
        if len(recv_nbytes) != self.world_size:
            raise ValueError(
                f"begin({kind}): {len(recv_nbytes)} receive sizes for "
                f"world_size={self.world_size}; give one per rank"
            )
        self._check_open(kind)
        self._seq += 1
        masked = self._mask.begin(self._seq, kind)
        need = max((int(n) for i, n in enumerate(recv_nbytes) if i != self.rank), default=0)
        if need > int(self._ctrl[_CAP]):
            self._grow(need)
        self._release_old_names(masked)
        self._ctrl[_READY] = self._seq
        return self._seq

    def write_peer(
        self, j: int, t: int, nbytes: int, fill: Callable[[torch.Tensor], Any], *, kind: str
    ) -> None:
        """Wait until peer ``j`` is ready for call ``t``, let ``fill`` write ``nbytes`` into this
        rank's slot of ``j``'s region (a flat uint8 view), then signal ``j``. A masked ``j``
        is skipped."""
        if j in self._mask.missing:
            return
        ctrl = self._peer_ctrl[j]
        backoff = Backoff(self.timeout_s)
        while ctrl[_READY] != t:
            if self._mask.idle(backoff, {j}, t, kind, "send"):
                return
        self._write_now(j, t, nbytes, fill, kind)

    def _write_now(
        self, j: int, t: int, nbytes: int, fill: Callable[[torch.Tensor], Any], kind: str
    ) -> None:
        ctrl = self._peer_ctrl[j]
        gen, cap = int(ctrl[_GEN]), int(ctrl[_CAP])
        mapped_gen, region = self._peer_data[j]
        if mapped_gen != gen:
            region = map_segment(self._data_path(j, gen), self.world_size * cap, create=False)
            self._peer_data[j] = (gen, region)
            ctrl[self._mapped(self.rank)] = gen
        if nbytes > cap:
            raise TransportError(
                f"rank {self.rank}: {kind} call {t}: {nbytes} bytes for rank {j} exceed its slot "
                f"of {cap}; ranks disagree on the splits"
            )
        start = self.rank * cap
        fill(region[start : start + nbytes])
        store_fence()
        ctrl[self._nbytes(self.rank)] = nbytes
        ctrl[self._done(self.rank)] = t

    def poll_slots(
        self, t: int, recv_nbytes: Sequence[int], *, kind: str
    ) -> Iterator[tuple[int, torch.Tensor]]:
        """Yield ``(source, slot)`` for every peer as its rows for call ``t`` arrive; ``slot``
        is a flat uint8 view into this rank's region, valid until the next :meth:`begin`.
        Masked peers are not yielded (see :meth:`missing_in_last_call`)."""
        cap = int(self._ctrl[_CAP])
        waiting = set(self.peers()) - self._mask.missing
        backoff = Backoff(self.timeout_s)
        while waiting:
            ready = [i for i in waiting if self._ctrl[self._done(i)] == t]
            if not ready:
                waiting -= self._mask.idle(backoff, waiting, t, kind, "receive")
                continue
            for i in ready:
                waiting.discard(i)
                yield i, self._arrived_slot(i, t, recv_nbytes[i], cap, kind)

    def exchange(
        self,
        t: int,
        writes: dict[int, tuple[int, Callable[[torch.Tensor], Any]]],
        recv_nbytes: Sequence[int],
        on_slot: Callable[[int, torch.Tensor], Any],
        *,
        kind: str,
    ) -> None:
        """Finish call ``t`` in whatever order the peers allow: write ``writes[j] = (nbytes,
        fill)`` to each peer as soon as it is ready, and hand each arrived slot to
        ``on_slot(source, slot)`` - so a descheduled peer does not hold up the others.
        Raises :class:`~nobubble.moe.transport.PeerFailure` after ``timeout_s`` without progress; with masking, masked
        peers are skipped and ``on_slot`` is not called for them."""
        to_write = {j: w for j, w in writes.items() if j not in self._mask.missing}
        to_read = set(self.peers()) - self._mask.missing
        cap = int(self._ctrl[_CAP])
        backoff = Backoff(self.timeout_s)
        arrived: set[int] = set()
        while to_write or to_read:
            progressed = False
            for j in [j for j in to_write if self._peer_ctrl[j][_READY] == t]:
                nbytes, fill = to_write.pop(j)
                self._write_now(j, t, nbytes, fill, kind)
                progressed = True
            for i in [i for i in to_read if self._ctrl[self._done(i)] == t]:
                to_read.discard(i)
                on_slot(i, self._arrived_slot(i, t, recv_nbytes[i], cap, kind))
                arrived.add(i)
                progressed = True
            if progressed:
                backoff = Backoff(self.timeout_s)
                continue
            for j in self._mask.idle(backoff, set(to_write) | to_read, t, kind, "exchange"):
                to_write.pop(j, None)
                to_read.discard(j)
        # a peer masked while this rank still had to write to it may have sent its rows
        # already: they arrived whole, so they are not missing (nor zeroed)
        self._mask.missing -= arrived

    def _arrived_slot(self, i: int, t: int, expected: int, cap: int, kind: str) -> torch.Tensor:
        """Source ``i``'s slot of call ``t`` (it signalled DONE), checked against the bytes this
        rank expects from it."""
        n = int(self._ctrl[self._nbytes(i)])
        if n != expected:
            raise TransportError(
                f"rank {self.rank}: {kind} call {t}: rank {i} sent {n} bytes but "
                f"{int(expected)} were expected; ranks disagree on the splits"
            )
        return self._data[i * cap : i * cap + n]

    def _grow(self, need: int) -> None:
        """Replace this rank's data region by a bigger one (no sender is using it now: every
        sender finished the previous call before this rank could complete it)."""
        cap = round_up(max(need, 2 * int(self._ctrl[_CAP])))
        gen = int(self._ctrl[_GEN]) + 1
        path = self._data_path(self.rank, gen)
        self._data = map_segment(path, self.world_size * cap, create=True)
        for stale in self._pending_unlink:
            unlink(stale)
        self._pending_unlink = [path]
        self._finalizer.detach()
        self._finalizer = weakref.finalize(self, cleanup, [path])
        self._ctrl[_CAP] = cap
        self._ctrl[_GEN] = gen

    def _release_old_names(self, masked: frozenset[int]) -> None:
        """Unlink the newest region's name once every live peer has mapped it."""
        gen = int(self._ctrl[_GEN])
        live = [i for i in self.peers() if i not in masked]
        if self._pending_unlink and all(self._ctrl[self._mapped(i)] == gen for i in live):
            for path in self._pending_unlink:
                unlink(path)
            self._pending_unlink.clear()

    # -- the Transport interface ------------------------------------------------------------
    def _exchange(
        self, segments: list[torch.Tensor], recv_nbytes: list[int], *, kind: str
    ) -> torch.Tensor:
        out = torch.empty(sum(recv_nbytes), dtype=torch.uint8)
        offsets = np.cumsum([0, *[int(n) for n in recv_nbytes]])
        t = self.begin(recv_nbytes, kind=kind)
        writes = {j: (segments[j].numel(), copier(segments[j])) for j in self.peers()}
        out[offsets[self.rank] : offsets[self.rank + 1]].copy_(segments[self.rank].reshape(-1))
        self.exchange(
            t,
            writes,
            recv_nbytes,
            lambda i, slot: out[offsets[i] : offsets[i + 1]].copy_(slot),
            kind=kind,
        )
        for i in self._mask.missing:  # masked sources: their rows read as zeros
            out[offsets[i] : offsets[i + 1]].zero_()
        return out

    def all_to_all(
        self,
        send: torch.Tensor,
        send_splits: Sequence[int],
        recv_splits: Sequence[int],
        *,
        kind: str,
    ) -> torch.Tensor:
        send_splits, recv_splits = check_splits(
            send, send_splits, recv_splits, self.world_size, kind
        )
        self._check_device(send, kind)
        send_bytes = _as_byte_rows(send)  # (S, row_bytes)
        row_bytes = send_bytes.shape[1]
        flat = send_bytes.view(-1)  # (S * row_bytes,)
        bounds = np.cumsum([0, *send_splits]) * row_bytes
        segments = [flat[bounds[j] : bounds[j + 1]] for j in range(self.world_size)]
        recv_nbytes = [n * row_bytes for n in recv_splits]
        out = self._exchange(segments, recv_nbytes, kind=kind)
        self.count_bytes(
            kind,
            sent=flat.numel(),
            remote=flat.numel() - segments[self.rank].numel(),
            received=out.numel(),
        )
        return _from_byte_rows(out.view(sum(recv_splits), row_bytes), send)

    def all_gather(self, x: torch.Tensor, *, kind: str) -> torch.Tensor:
        self._check_device(x, kind)
        rows = _as_byte_rows(x)  # (n, row_bytes)
        flat = rows.reshape(-1)
        out = self._exchange([flat] * self.world_size, [flat.numel()] * self.world_size, kind=kind)
        n = flat.numel()  # delivered to every rank, this one included (as TorchDistTransport)
        self.count_bytes(
            kind, sent=n * self.world_size, remote=n * (self.world_size - 1), received=out.numel()
        )
        return _from_byte_rows(out.view(self.world_size * rows.shape[0], rows.shape[1]), x)

    def reduce_scatter(self, x: torch.Tensor, *, kind: str) -> torch.Tensor:
        """``[R * n, ...]`` on every rank -> this rank's ``[n, ...]`` block, summed in rank order."""
        n = self._block_rows(x, kind)
        self._check_device(x, kind)
        blocks = self.all_to_all(x, [n] * self.world_size, [n] * self.world_size, kind=kind)
        blocks = blocks.reshape(self.world_size, n, *x.shape[1:])  # (R, n, ...)
        out = blocks[0].clone()
        for i in range(1, self.world_size):
            out += blocks[i]
        return out

    def _check_device(self, t: torch.Tensor, kind: str) -> None:
        if t.device.type != "cpu":
            raise ValueError(
                f"ShmTransport.{kind}: tensor on {t.device}; shared memory carries CPU tensors - "
                "use TorchDistTransport (NCCL) for GPU tensors"
            )


def default_transport_kind(backend: str, device: str | torch.device) -> str:
    """``"shm"`` for gloo on CPU (one host), ``"dist"`` (NCCL / gloo collectives) otherwise."""
    return "shm" if backend == "gloo" and torch.device(device).type == "cpu" else "dist"


def make_transport(
    kind: str = "auto",
    group: dist.ProcessGroup | None = None,
    *,
    device: str | torch.device = "cpu",
    timeout_s: float = 120.0,
    capacity_bytes_per_peer: int = 1 << 20,
    mask_failed_ranks: bool = False,
) -> Transport:
    """Build the transport named ``kind``: ``"shm"``, ``"dist"`` or ``"auto"`` (by backend/device).

    ``"auto"`` also falls back to ``"dist"`` when the group spans several hosts.
    ``mask_failed_ranks`` needs shared memory (``"shm"``, or ``"auto"`` choosing it).
    """
    if kind not in TRANSPORT_KINDS:
        raise ValueError(f"make_transport: kind={kind!r}; choose one of {TRANSPORT_KINDS}")
    if mask_failed_ranks and kind == "dist":
        raise ValueError(
            "make_transport: mask_failed_ranks=True needs kind='shm' (a gloo/NCCL collective "
            "cannot complete without a dead member); use kind='shm' or mask_failed_ranks=False"
        )
    if kind == "auto":
        kind = default_transport_kind(dist.get_backend(group), device)
        if kind == "shm":
            kind = "shm" if len(group_hosts(group)) == 1 else "dist"
    if kind == "shm":
        return ShmTransport(
            group,
            timeout_s=timeout_s,
            capacity_bytes_per_peer=capacity_bytes_per_peer,
            mask_failed_ranks=mask_failed_ranks,
        )
    if mask_failed_ranks:
        raise ValueError(
            "make_transport: mask_failed_ranks=True, but kind='auto' chose 'dist' (the group "
            "spans hosts or is not gloo on CPU); masking needs the shared-memory transport"
        )
    return TorchDistTransport(group, timeout_s=timeout_s)
