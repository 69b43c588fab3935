"""Which ranks reached call ``t``: a per-rank call counter in a ``torch.distributed`` store.

A failed collective does not say which peer is missing. Before each collective every rank
writes the number of the call it enters under its own key (``r<rank>``); after a failure a
survivor reads all keys, and a rank whose count is below the failing call's number never got
there. The store is a :class:`torch.distributed.TCPStore` served by rank 0 on a thread of its
own (a rank 0 that is gone is named itself). Cost: one store round trip per collective;
``track_arrivals=False`` turns it off.

Lifecycle: ``create`` (collective, at the first call) -> ``enter(t)`` before every call ->
``missing(t)`` after a failure. The transport errors (:class:`TransportError`,
:class:`PeerFailure` naming a phase of :data:`PHASES` and the ranks) live here too.
"""

from __future__ import annotations

import socket
from collections.abc import Callable
from dataclasses import dataclass, fields, replace
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

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


@dataclass(eq=False, repr=False, kw_only=True)
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

    rank: int
    world_size: int
    phase: str
    operation: str
    failed_ranks: tuple[int, ...]
    waited_s: float
    timeout_s: float
    call: int | None = None
    detail: str = ""

    def __post_init__(self) -> None:
        self.failed_ranks = tuple(sorted({int(r) for r in self.failed_ranks}))
        self.waited_s, self.timeout_s = float(self.waited_s), float(self.timeout_s)
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
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def in_phase(self, phase: str) -> PeerFailure:
        """The same failure, attributed to ``phase`` (a caller knows the phase better)."""
        return replace(self, phase=phase)

    def __reduce__(self) -> tuple[Any, ...]:  # keyword-only __init__: pickle by fields
        return (_rebuild_peer_failure, (self._fields(),))


def _rebuild_peer_failure(state: dict[str, Any]) -> PeerFailure:
    return PeerFailure(**state)


__all__ = ["ArrivalStore", "PHASES", "PeerFailure", "TransportError", "phase_of"]

_HOST_CHARS = 255  # longest host name (RFC 1123)
_READ_TIMEOUT_S = 5.0  # a store read after a failure: the server is local to rank 0


class ArrivalStore:
    """Per-rank call counters of one transport, in a store every rank can read.

    Args:
        store: the shared store (keys ``r0 .. r{R-1}``).
        rank: this rank in the group; ``world_size``: ``R``.
        server: rank 0 keeps its server object alive here (None elsewhere).
    """

    def __init__(
        self, store: dist.Store, rank: int, world_size: int, server: Any | None = None
    ) -> None:
        self.store, self.rank, self.world_size, self._server = store, rank, world_size, server
        self.store.set(self._key(rank), "0")

    @staticmethod
    def _key(rank: int) -> str:
        return f"r{rank}"

    @classmethod
    def create(
        cls,
        group: dist.ProcessGroup | None,
        rank: int,
        world_size: int,
        *,
        device: torch.device,
        wait: Callable[[Any, str], None],
        connect_timeout_s: float = _READ_TIMEOUT_S,
    ) -> ArrivalStore:
        """Collective over ``group``: rank 0 serves a store, everyone connects to it.

        ``device`` carries the broadcast (NCCL needs a CUDA tensor); ``wait(work, what)`` is
        the transport's bounded wait; ``connect_timeout_s`` bounds a client's connection (the
        transport's own timeout: a loaded machine may take seconds to accept it), after which
        reads wait at most ``_READ_TIMEOUT_S``.
        """
        timeout = timedelta(seconds=_READ_TIMEOUT_S)
        connect = timedelta(seconds=max(connect_timeout_s, _READ_TIMEOUT_S))
        server = None
        # (1 + HOST_CHARS,) int64: the port, then rank 0's host name, one character a slot
        info = torch.zeros(1 + _HOST_CHARS, dtype=torch.int64)
        if rank == 0:
            # the server connects to itself as a client too: within the connect timeout
            server = dist.TCPStore(
                "127.0.0.1", 0, None, True, timeout=connect, wait_for_workers=False
            )
            server.set_timeout(timeout)
            name = socket.gethostname().encode()[:_HOST_CHARS]
            info[0] = server.port
            info[1 : 1 + len(name)] = torch.tensor(list(name), dtype=torch.int64)
        info = info.to(device)
        src = dist.get_global_rank(group, 0) if group is not None else 0
        wait(dist.broadcast(info, src=src, group=group, async_op=True), "broadcast(arrivals)")
        info = info.cpu()
        if server is not None:
            return cls(server, rank, world_size, server)
        port = int(info[0])
        host = bytes(int(c) for c in info[1:] if c).decode()
        # Same host: the loopback address always works; else rank 0's name must resolve.
        address = "127.0.0.1" if host == socket.gethostname() else host
        client = dist.TCPStore(address, port, None, False, timeout=connect)
        client.set_timeout(timeout)
        return cls(client, rank, world_size)

    def enter(self, call: int) -> None:
        """Record that this rank is entering call number ``call``."""
        self.store.set(self._key(self.rank), str(call))

    def missing(self, call: int) -> tuple[tuple[int, ...], str]:
        """``(ranks that never entered call, how they were found)``; this rank excluded."""
        try:
            counts = []
            for r in range(self.world_size):
                key = self._key(r)
                counts.append(int(self.store.get(key)) if self.store.check([key]) else 0)
        except Exception as err:  # noqa: BLE001 - any store error means its host is gone
            if self.rank == 0:
                return (), f"arrival store unreadable ({type(err).__name__})"
            return (0,), "the arrival store on rank 0 does not answer: rank 0 is gone"
        behind = tuple(r for r, n in enumerate(counts) if n < call and r != self.rank)
        return behind, f"call counts per rank {counts}"
