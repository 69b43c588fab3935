"""Which ranks reached call ``t``: a per-rank call counter in a ``torch.distributed`` store.

A failed collective says only that it failed: gloo reports a closed connection or a timeout,
never which peer is missing. So before each collective every rank writes the number of the
call it is entering under its own key (``r<rank>``), and when a call fails the survivor reads
all the keys: a rank whose count is below the failing call's number never got there - it
died or hangs elsewhere. Every rank issues the same sequence of calls, so the numbers agree.

The store is a :class:`torch.distributed.TCPStore` served by rank 0 of the group (public API;
the default group's own store has no public getter), set up at the transport's first call:
rank 0 opens it on a free port and broadcasts the port and its host name. The server runs on
a thread of its own, so a rank 0 that hangs still answers; a rank 0 that is gone does not,
and then the reader names rank 0 (the store's host). Cost: one store write per
collective, a synchronous TCP round trip to rank 0's store thread (tens of microseconds on
loopback, more across hosts); ``track_arrivals=False`` turns it off.

Lifecycle: ``create`` (collective, at the first call) -> ``enter(t)`` before every call ->
``missing(t)`` after a failure.
"""

from __future__ import annotations

import socket
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

__all__ = ["ArrivalStore"]

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
        server = None
        # (1 + HOST_CHARS,) int64: the port, then rank 0's host name, one character a slot
        info = torch.zeros(1 + _HOST_CHARS, dtype=torch.int64)
        if rank == 0:
            server = dist.TCPStore(
                "127.0.0.1", 0, None, True, timeout=timeout, wait_for_workers=False
            )
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
        connect = timedelta(seconds=max(connect_timeout_s, _READ_TIMEOUT_S))
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
