"""The transport seam: how rows of bytes travel between expert-parallel ranks.

:class:`~nobubble.moe.buffer.Buffer` decides which rows go where; a :class:`Transport` moves
them, as raw bytes (any dtype crosses bit for bit). :class:`TorchDistTransport` uses the
group's ``torch.distributed`` backend. Every wait has a timeout: a silent peer raises
:class:`PeerFailure` naming the operation, the phase and the ranks that did not arrive
(:class:`~nobubble.moe.arrivals.ArrivalStore`); a transport that goes on without it
implements :class:`FailureMasking`. A transport declares its extras in a frozen
:class:`Capabilities` record, and counts what it moves per ``kind`` in
:class:`TransportStats` (bytes sent, own rows included as DeepEP counts them; bytes that left
the rank; calls). See ``docs/moe/dispatch.md`` and ``docs/moe/failures.md``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Protocol

import torch
import torch.distributed as dist

from nobubble.moe.arrivals import (
    PHASES,
    ArrivalStore,
    PeerFailure,
    TransportError,
    phase_of,
)

__all__ = [
    "PHASES",
    "Capabilities",
    "FailureMasking",
    "PeerFailure",
    "Transport",
    "PeerWrites",
    "TorchDistTransport",
    "TransportError",
    "TransportStats",
    "phase_of",
]


@dataclass(frozen=True)
class TransportStats:
    """What a transport moved since its last :meth:`reset`, per kind label.

    Attributes:
        bytes_sent: bytes this rank delivered, once per destination, its own rows included
            (an all-gather of n bytes counts R * n).
        bytes_sent_remote: the part of ``bytes_sent`` addressed to other ranks.
        bytes_received: bytes of rows this rank got back (its own rows included).
        calls: collective calls.
    """

    bytes_sent: dict[str, int] = field(default_factory=dict)
    bytes_sent_remote: dict[str, int] = field(default_factory=dict)
    bytes_received: dict[str, int] = field(default_factory=dict)
    calls: dict[str, int] = field(default_factory=dict)

    def total_sent(self) -> int:
        return sum(self.bytes_sent.values())


@dataclass(frozen=True)
class Capabilities:
    """What a transport can do beyond the three collectives; the buffer picks its fast paths from
    it (a transport without a ``capabilities`` attribute has none).

    Attributes:
        peer_writes: it implements :class:`PeerWrites`.
        split_all_to_all: it has ``all_to_all_start`` (launch now, wait later), which the
            low-latency receive hook uses when rows cannot be written into peers.
        masks_failed_ranks: it implements :class:`FailureMasking` with masking turned on.
    """

    peer_writes: bool = False
    split_all_to_all: bool = False
    masks_failed_ranks: bool = False


NO_CAPABILITIES = Capabilities()


def capabilities_of(transport: object) -> Capabilities:
    """The transport's declared :class:`Capabilities` (none when it declares none)."""
    return getattr(transport, "capabilities", NO_CAPABILITIES)


class Transport(Protocol):
    """Moves rows between ranks. ``rank``/``world_size`` describe this rank's group; ``kind``
    names the transport (``"dist"``, ``"shm"``) in reports; ``capabilities`` (optional)
    declares its fast paths (:class:`Capabilities`)."""

    rank: int
    world_size: int
    kind: str

    def all_to_all(
        self,
        send: torch.Tensor,
        send_splits: Sequence[int],
        recv_splits: Sequence[int],
        *,
        kind: str,
    ) -> torch.Tensor:
        """Send ``send[offsets[r]:offsets[r+1]]`` to rank r; return the received rows in rank order."""
        ...

    def all_gather(self, x: torch.Tensor, *, kind: str) -> torch.Tensor:
        """``[n, ...]`` on every rank (same n) -> ``[R * n, ...]`` in rank order."""
        ...

    def reduce_scatter(self, x: torch.Tensor, *, kind: str) -> torch.Tensor:
        """``[R * n, ...]`` on every rank -> this rank's ``[n, ...]`` block summed over ranks."""
        ...

    def stats(self) -> TransportStats: ...

    def reset_stats(self) -> None: ...

    def close(self) -> None:
        """Release what the transport holds (shared memory, ...); a no-op where nothing is."""
        ...


class PeerWrites(Protocol):
    """The capability of writing rows straight into a peer's receive slot (shared memory on one
    host), for gather-on-write dispatch, reduce-on-read combine and the low-latency send without
    receive. Every rank issues the same sequence of calls: ``t = begin(recv_nbytes)``, then
    ``write_peer`` / ``poll_slots`` (or both at once with ``exchange``).
    """

    rank: int
    world_size: int

    def peers(self) -> list[int]:
        """The other ranks of the group."""
        ...

    def begin(self, recv_nbytes: Sequence[int], *, kind: str) -> int:
        """Start a call expecting ``recv_nbytes[i]`` bytes from each rank ``i``; returns ``t``."""
        ...

    def write_peer(
        self, j: int, t: int, nbytes: int, fill: Callable[[torch.Tensor], Any], *, kind: str
    ) -> None:
        """Let ``fill`` write ``nbytes`` into this rank's slot of peer ``j`` (call ``t``)."""
        ...

    def poll_slots(
        self, t: int, recv_nbytes: Sequence[int], *, kind: str
    ) -> Iterator[tuple[int, torch.Tensor]]:
        """Yield ``(source, slot)`` as each peer's rows for call ``t`` arrive."""
        ...

    def exchange(
        self,
        t: int,
        writes: Mapping[int, tuple[int, Callable[[torch.Tensor], Any]]],
        recv_nbytes: Sequence[int],
        on_slot: Callable[[int, torch.Tensor], Any],
        *,
        kind: str,
    ) -> None:
        """Write ``writes[j] = (nbytes, fill)`` and hand arrived slots to ``on_slot`` in
        whatever order the peers allow."""
        ...

    def count_bytes(self, kind: str, sent: int, remote: int, received: int) -> None:
        """Add one call's bytes to the transport's statistics."""
        ...


class FailureMasking(Protocol):
    """The capability of going on without failed peers (DeepEP's low-latency mask buffer).

    With ``mask_failed_ranks`` on, a peer silent past the timeout is marked failed in a mask every
    rank reads; the current call completes without it (its rows read as zeros) and later calls
    skip it.
    """

    mask_failed_ranks: bool

    def masked_ranks(self) -> frozenset[int]:
        """Ranks the group has marked failed (never shrinks)."""
        ...

    def missing_in_last_call(self) -> frozenset[int]:
        """Sources whose rows did not arrive in this rank's latest call (read as zeros)."""
        ...


def _as_byte_rows(x: torch.Tensor) -> torch.Tensor:
    """``[S, *row]`` of any dtype -> ``[S, row_bytes]`` uint8 view (a copy only if not contiguous)."""
    x = x.contiguous()
    row_numel = math.prod(x.shape[1:])
    return x.reshape(x.shape[0], row_numel).view(torch.uint8)  # (S, row_bytes)


def _from_byte_rows(raw: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`_as_byte_rows`: ``[M, row_bytes]`` uint8 -> ``[M, *like.shape[1:]]``."""
    return raw.view(like.dtype).reshape(raw.shape[0], *like.shape[1:])


def check_splits(
    send: torch.Tensor,
    send_splits: Sequence[int],
    recv_splits: Sequence[int],
    world_size: int,
    kind: str,
) -> tuple[list[int], list[int]]:
    """The splits of an all-to-all as ints, checked: one per rank, >= 0, sending all rows."""
    send_splits, recv_splits = [int(s) for s in send_splits], [int(s) for s in recv_splits]
    if len(send_splits) != world_size or len(recv_splits) != world_size:
        raise ValueError(
            f"all_to_all({kind}): {len(send_splits)} send / {len(recv_splits)} recv splits "
            f"for world_size={world_size}; give one split per rank"
        )
    if sum(send_splits) != send.shape[0] or min(send_splits + recv_splits, default=0) < 0:
        raise ValueError(
            f"all_to_all({kind}): send splits {send_splits} must be >= 0 and sum to the "
            f"{send.shape[0]} rows of send"
        )
    return send_splits, recv_splits


class ByteCounting:
    """What every transport shares: its group (checked), the timeout, and the per-kind byte
    counters (``reset_stats``, ``stats``)."""

    _counters: dict[str, dict[str, int]]

    def _join(self, name: str, group: dist.ProcessGroup | None, timeout_s: float) -> None:
        """Check torch.distributed is up and ``timeout_s > 0``; set ``group``, ``timeout_s``,
        ``rank``, ``world_size`` and zero the counters (``name`` prefixes the errors)."""
        if not dist.is_initialized():
            raise ValueError(
                f"{name}: torch.distributed is not initialised; start the ranks with "
                "nobubble.distributed.spawn or torchrun first"
            )
        if not timeout_s > 0:
            raise ValueError(f"{name}: timeout_s={timeout_s} must be > 0")
        self.group, self.timeout_s = group, float(timeout_s)
        self.rank, self.world_size = dist.get_rank(group), dist.get_world_size(group)
        self.reset_stats()

    def _block_rows(self, x: torch.Tensor, kind: str) -> int:
        """Rows of each rank's block of a reduce-scatter of ``x``; refuses an uneven split."""
        if x.shape[0] % self.world_size != 0:
            raise ValueError(
                f"reduce_scatter({kind}): {x.shape[0]} rows do not split over {self.world_size} ranks"
            )
        return x.shape[0] // self.world_size

    def reset_stats(self) -> None:
        self._counters = {"sent": {}, "remote": {}, "received": {}, "calls": {}}

    def stats(self) -> TransportStats:
        c = self._counters
        return TransportStats(
            dict(c["sent"]), dict(c["remote"]), dict(c["received"]), dict(c["calls"])
        )

    def count_bytes(self, kind: str, sent: int, remote: int, received: int) -> None:
        for key, value in (
            ("sent", sent),
            ("remote", remote),
            ("received", received),
            ("calls", 1),
        ):
            self._counters[key][kind] = self._counters[key].get(kind, 0) + value


class TorchDistTransport(ByteCounting):
    """All-to-all over a ``torch.distributed`` process group, with byte counting and timeouts.

    Args:
        group: the expert-parallel process group (``None`` = the default group).
        timeout_s: the longest any single collective may take before :class:`PeerFailure`.
        track_arrivals: record each call's number in an
            :class:`~nobubble.moe.arrivals.ArrivalStore` (set up at the first call; one store
            write per call) so that errors name the missing ranks (``False``: the phase only).
    """

    def __init__(
        self,
        group: dist.ProcessGroup | None = None,
        *,
        timeout_s: float = 120.0,
        track_arrivals: bool = True,
    ) -> None:
        self._join("TorchDistTransport", group, timeout_s)
        self.kind = "dist"
        self.capabilities = Capabilities(split_all_to_all=True)
        self.track_arrivals = track_arrivals
        self._calls = 0
        self._arrivals: ArrivalStore | None = None

    def _failure(self, what: str, kind: str, waited: float, err: BaseException) -> PeerFailure:
        cause = f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
        failed: tuple[int, ...] = ()
        how = "arrivals not tracked"
        if self._arrivals is not None:
            failed, how = self._arrivals.missing(self._calls)
        return PeerFailure(
            rank=self.rank,
            world_size=self.world_size,
            phase=phase_of(kind),
            operation=what,
            failed_ranks=failed,
            waited_s=waited,
            timeout_s=self.timeout_s,
            call=self._calls,
            detail=f"{how}; {cause}",
        )

    def _start(
        self, launch: Callable[[], Any], what: str, kind: str, device: torch.device
    ) -> Callable[[], None]:
        """Enter call number ``self._calls + 1`` (recorded) and launch the collective; the
        returned function waits for it (``_start(...)()`` runs it to the end). Either step
        raises :class:`PeerFailure`."""
        start = time.monotonic()
        try:
            if self.track_arrivals and self._arrivals is None:
                self._arrivals = ArrivalStore.create(
                    self.group, self.rank, self.world_size, device=device, wait=self._wait,
                    connect_timeout_s=self.timeout_s,
                )  # fmt: skip
            self._calls += 1
            if self._arrivals is not None:
                self._arrivals.enter(self._calls)
            work = launch()
        except PeerFailure:
            raise
        except Exception as err:  # gloo/NCCL raise RuntimeError subclasses; keep the cause
            raise self._failure(what, kind, time.monotonic() - start, err) from err

        def wait() -> None:
            try:
                self._wait(work, what)
            except Exception as err:
                raise self._failure(what, kind, time.monotonic() - start, err) from err

        return wait

    def _wait(self, work: Any, what: str) -> None:
        work.wait(timeout=timedelta(seconds=self.timeout_s))

    # -- collectives ------------------------------------------------------------------------
    def all_to_all(
        self,
        send: torch.Tensor,
        send_splits: Sequence[int],
        recv_splits: Sequence[int],
        *,
        kind: str,
    ) -> torch.Tensor:
        return self.all_to_all_start(send, send_splits, recv_splits, kind=kind)()

    def all_to_all_start(
        self,
        send: torch.Tensor,
        send_splits: Sequence[int],
        recv_splits: Sequence[int],
        *,
        kind: str,
    ) -> Callable[[], torch.Tensor]:
        """Launch :meth:`all_to_all` now; the returned function waits (within ``timeout_s``)
        and returns the received rows. Nothing else may run on the group in between."""
        send_splits, recv_splits = check_splits(
            send, send_splits, recv_splits, self.world_size, kind
        )
        send_bytes = _as_byte_rows(send)  # (S, row_bytes)
        row_bytes = send_bytes.shape[1]
        recv_bytes = torch.empty(
            (sum(recv_splits), row_bytes), dtype=torch.uint8, device=send.device
        )  # (M, row_bytes)
        wait = self._start(
            lambda: dist.all_to_all_single(
                recv_bytes, send_bytes, recv_splits, send_splits, group=self.group, async_op=True
            ),
            f"all_to_all({kind})",
            kind,
            send.device,
        )
        self.count_bytes(
            kind,
            sent=send_bytes.numel(),
            remote=(send_bytes.shape[0] - send_splits[self.rank]) * row_bytes,
            received=recv_bytes.numel(),
        )

        def finish() -> torch.Tensor:
            wait()
            return _from_byte_rows(recv_bytes, send)

        return finish

    def all_gather(self, x: torch.Tensor, *, kind: str) -> torch.Tensor:
        send_bytes = _as_byte_rows(x)
        out = torch.empty(
            (self.world_size * send_bytes.shape[0], send_bytes.shape[1]),
            dtype=torch.uint8,
            device=x.device,
        )  # (R * n, row_bytes)
        gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
        self._start(
            lambda: gather(out, send_bytes, group=self.group, async_op=True),
            f"all_gather({kind})",
            kind,
            x.device,
        )()
        n = send_bytes.numel()  # delivered to every rank, this one included
        self.count_bytes(
            kind, sent=n * self.world_size, remote=n * (self.world_size - 1), received=out.numel()
        )
        return _from_byte_rows(out, x)

    def reduce_scatter(self, x: torch.Tensor, *, kind: str) -> torch.Tensor:
        self._block_rows(x, kind)
        # A sum cannot travel as bytes: reduce in the tensor's own dtype.
        x = x.contiguous()
        out = torch.empty(
            (x.shape[0] // self.world_size, *x.shape[1:]), dtype=x.dtype, device=x.device
        )
        scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
        self._start(
            lambda: scatter(out, x, group=self.group, async_op=True),
            f"reduce_scatter({kind})",
            kind,
            x.device,
        )()
        block = out.numel() * out.element_size()
        self.count_bytes(
            kind,
            sent=x.numel() * x.element_size(),
            remote=block * (self.world_size - 1),
            received=block,
        )
        return out

    def close(self) -> None:
        """Drop the arrival store (the process group belongs to the caller)."""
        self._arrivals = None
