"""The transport seam: how rows of bytes travel between expert-parallel ranks.

:class:`~nobubble.moe.buffer.Buffer` decides *which* rows go *where*; a transport moves them.
:class:`TorchDistTransport` uses ``torch.distributed`` collectives (gloo on CPU, NCCL on GPU -
the backend is the process group's, never a literal here). A later transport (shared memory
within a host, hierarchical intra/inter-node) implements the same three methods and is passed
to ``Buffer(transport=...)``.

Every payload travels as raw bytes (a ``uint8`` view of its rows), so any dtype - bf16, FP8,
int16 - crosses any backend bit for bit. Every wait has a timeout: a peer that died or stopped
answering raises :class:`PeerFailure` (a :class:`TransportError`) naming the operation, the
phase (``layout``, ``dispatch``, ``combine``, ``rebalance``) and the ranks that did not arrive,
instead of hanging. A collective cannot say who is missing, so :class:`TorchDistTransport`
keeps a count of the calls each rank entered in a store
(:class:`~nobubble.moe.arrivals.ArrivalStore`) and reads it on a failure; a transport that
can also go on without a failed peer implements :class:`FailureMasking` (see
``docs/moe/failures.md``).

The transport counts what it moves, per ``kind`` label (``"x"``, ``"topk"``, ``"layout"``...),
in :class:`TransportStats`: the bytes this rank sent (its own rows included, as DeepEP counts
them), the part of them that left the rank, and the number of collective calls.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Protocol, runtime_checkable

import torch
import torch.distributed as dist

from nobubble.moe.arrivals import ArrivalStore

__all__ = [
    "PHASES",
    "FailureMasking",
    "PeerFailure",
    "Transport",
    "PeerWrites",
    "TorchDistTransport",
    "TransportError",
    "TransportStats",
    "phase_of",
]

PHASES = ("layout", "dispatch", "combine", "rebalance")
_LAYOUT_KINDS = ("layout", "topk_idx")
_REBALANCE_KINDS = ("placement", "expert_migration", "load", "load_stats")


def phase_of(kind: str) -> str:
    """The phase a transport call of ``kind`` belongs to, when no caller says otherwise.

    Count and metadata exchanges (``layout``, ``topk_idx``, ``*_layout``, ``*_meta``) are the
    ``layout`` phase; placement, statistics and expert migration the ``rebalance`` phase;
    kinds naming combine the ``combine`` phase; everything else moves token rows outwards,
    the ``dispatch`` phase. :class:`~nobubble.moe.buffer.Buffer` names its row movers' phase
    itself (``combine_rows`` is ``combine`` even for a gradient).
    """
    if kind in _LAYOUT_KINDS or kind.endswith(("_layout", "_meta")):
        return "layout"
    if kind in _REBALANCE_KINDS:
        return "rebalance"
    return "combine" if "combine" in kind else "dispatch"


class TransportError(RuntimeError):
    """A collective failed or timed out: a peer rank died, hung, or disagreed on sizes."""


class PeerFailure(TransportError):
    """A call could not complete because peer ranks died or stopped answering.

    Attributes:
        rank: the rank that raised; ``world_size``: its group's size.
        phase: one of :data:`PHASES` - where in the step the wait failed.
        operation: the transport call, e.g. ``"all_to_all(x)"``.
        failed_ranks: the ranks that did not arrive, sorted; empty when every rank reached
            the call (one died inside it, or the ranks disagree on the sequence of calls).
        call: the transport's call number (the same on every rank), or None.
        waited_s: how long this rank waited; ``timeout_s``: its limit.
        detail: how the failed ranks were found, and the backend's own error.
    """

    def __init__(
        self,
        *,
        rank: int,
        world_size: int,
        phase: str,
        operation: str,
        failed_ranks: Sequence[int],
        waited_s: float,
        timeout_s: float,
        call: int | None = None,
        detail: str = "",
    ) -> None:
        self.rank, self.world_size = rank, world_size
        self.phase, self.operation = phase, operation
        self.failed_ranks: tuple[int, ...] = tuple(sorted({int(r) for r in failed_ranks}))
        self.waited_s, self.timeout_s = float(waited_s), float(timeout_s)
        self.call, self.detail = call, detail
        super().__init__(self._message())

    def _message(self) -> str:
        call = f", call {self.call}" if self.call is not None else ""
        who = (
            f"rank(s) {list(self.failed_ranks)} did not arrive"
            if self.failed_ranks
            else "every rank reached this call (one died inside it, or the ranks issued "
            "different sequences of calls)"
        )
        detail = f" [{self.detail}]" if self.detail else ""
        return (
            f"rank {self.rank}/{self.world_size}: {self.phase} phase, {self.operation}{call}: "
            f"{who} after {self.waited_s:.1f}s (timeout {self.timeout_s:g}s): a peer rank died "
            f"or stopped responding{detail}"
        )

    def _fields(self) -> dict[str, Any]:
        names = ("rank", "world_size", "phase", "operation", "failed_ranks", "waited_s")
        fields = {name: getattr(self, name) for name in names}
        fields.update(timeout_s=self.timeout_s, call=self.call, detail=self.detail)
        return fields

    def in_phase(self, phase: str) -> PeerFailure:
        """The same failure, attributed to ``phase`` (a caller knows the phase better)."""
        return PeerFailure(**{**self._fields(), "phase": phase})

    def __reduce__(self) -> tuple[Any, ...]:  # keyword-only __init__: pickle by fields
        return (_rebuild_peer_failure, (self._fields(),))


def _rebuild_peer_failure(fields: dict[str, Any]) -> PeerFailure:
    return PeerFailure(**fields)


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


@runtime_checkable
class Transport(Protocol):
    """Moves rows between ranks. ``rank``/``world_size`` describe this rank's group; ``kind``
    names the transport (``"dist"``, ``"shm"``) in reports."""

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


@runtime_checkable
class PeerWrites(Protocol):
    """The capability of writing rows straight into a peer's receive slot.

    A transport with it (shared memory on one host; NVLink or RDMA would be others) lets the
    fused paths skip the collective: gather-on-write dispatch, reduce-on-read combine, and the
    low-latency mode's send without receive. Paths test for the capability with
    ``isinstance(transport, PeerWrites)``, not for a transport class. Every rank issues the
    same sequence of calls: ``t = begin(recv_nbytes)``, then ``write_peer`` / ``poll_slots``
    (or both at once with ``exchange``).
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


@runtime_checkable
class FailureMasking(Protocol):
    """The capability of going on without failed peers (DeepEP's low-latency mask buffer).

    With ``mask_failed_ranks`` on, a peer that does not answer within the timeout is marked
    failed in a mask that every rank reads (the survivors agree on it by the next call), the
    current call completes without it (its rows read as zeros) and later calls skip it.
    :class:`~nobubble.moe.buffer.Buffer` drops or re-routes the top-k slots of masked ranks
    and counts them.
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
    """Per-kind byte counters shared by every transport (``reset_stats``, ``stats``)."""

    _counters: dict[str, dict[str, int]]

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

    A failed or timed-out collective raises :class:`PeerFailure`. With ``track_arrivals``,
    every rank records the number of the call it enters in an
    :class:`~nobubble.moe.arrivals.ArrivalStore` (one store write per call: a TCP round trip to rank 0's store)
    and on a failure the survivor reads which ranks never reached this call - the ones it
    names. The store is set up at the first call (one extra broadcast).

    Args:
        group: the expert-parallel process group (``None`` = the default group).
        timeout_s: the longest any single collective may take before :class:`PeerFailure`.
        track_arrivals: record arrivals so that errors name the missing ranks (``False``:
            errors name the phase only).
    """

    def __init__(
        self,
        group: dist.ProcessGroup | None = None,
        *,
        timeout_s: float = 120.0,
        track_arrivals: bool = True,
    ) -> None:
        if not dist.is_initialized():
            raise ValueError(
                "TorchDistTransport: torch.distributed is not initialised; start the ranks with "
                "nobubble.distributed.spawn or torchrun first"
            )
        if not timeout_s > 0:
            raise ValueError(f"TorchDistTransport: timeout_s={timeout_s} must be > 0")
        self.kind = "dist"
        self.group = group
        self.timeout_s = float(timeout_s)
        self.rank = dist.get_rank(group)
        self.world_size = dist.get_world_size(group)
        self.track_arrivals = track_arrivals
        self._calls = 0
        self._arrivals: ArrivalStore | None = None
        self._counters: dict[str, dict[str, int]] = {}
        self.reset_stats()

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

    def _run(self, launch: Callable[[], Any], what: str, kind: str, device: torch.device) -> None:
        """Enter call number ``self._calls + 1`` (recorded), launch the collective, wait."""
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
            self._wait(launch(), what)
        except PeerFailure:
            raise
        except Exception as err:  # gloo/NCCL raise RuntimeError subclasses; keep the cause
            raise self._failure(what, kind, time.monotonic() - start, err) from err

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
        send_splits, recv_splits = check_splits(
            send, send_splits, recv_splits, self.world_size, kind
        )
        send_bytes = _as_byte_rows(send)  # (S, row_bytes)
        row_bytes = send_bytes.shape[1]
        recv_bytes = torch.empty(
            (sum(recv_splits), row_bytes), dtype=torch.uint8, device=send.device
        )  # (M, row_bytes)
        self._run(
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
        return _from_byte_rows(recv_bytes, send)

    def all_gather(self, x: torch.Tensor, *, kind: str) -> torch.Tensor:
        send_bytes = _as_byte_rows(x)
        out = torch.empty(
            (self.world_size * send_bytes.shape[0], send_bytes.shape[1]),
            dtype=torch.uint8,
            device=x.device,
        )  # (R * n, row_bytes)
        gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
        self._run(
            lambda: gather(out, send_bytes, group=self.group, async_op=True),
            f"all_gather({kind})",
            kind,
            x.device,
        )
        n = send_bytes.numel()  # delivered to every rank, this one included
        self.count_bytes(
            kind, sent=n * self.world_size, remote=n * (self.world_size - 1), received=out.numel()
        )
        return _from_byte_rows(out, x)

    def reduce_scatter(self, x: torch.Tensor, *, kind: str) -> torch.Tensor:
        if x.shape[0] % self.world_size != 0:
            raise ValueError(
                f"reduce_scatter({kind}): {x.shape[0]} rows do not split over {self.world_size} ranks"
            )
        # A sum cannot travel as bytes: reduce in the tensor's own dtype.
        x = x.contiguous()
        out = torch.empty(
            (x.shape[0] // self.world_size, *x.shape[1:]), dtype=x.dtype, device=x.device
        )
        scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
        self._run(
            lambda: scatter(out, x, group=self.group, async_op=True),
            f"reduce_scatter({kind})",
            kind,
            x.device,
        )
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
