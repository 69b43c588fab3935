"""Shared-memory segments in ``/dev/shm`` and the waits on them, for :mod:`.shm_transport`.

A segment is a file in ``/dev/shm`` mapped as a uint8 tensor; its bytes are reserved when it
is created, so a full ``/dev/shm`` fails with a message instead of a SIGBUS on first write.
The ranks of a group name their segments by a key they agree on (:func:`agree_on_key`).
"""

from __future__ import annotations

import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from nobubble.moe.transport import TransportError

__all__ = [
    "ALIGN",
    "agree_on_key",
    "group_hosts",
    "barrier",
    "round_up",
    "map_segment",
    "reserve",
    "unlink",
    "store_fence",
    "Backoff",
    "copier",
    "cleanup",
]

ALIGN = 4096


def group_hosts(group: dist.ProcessGroup | None) -> set[str]:
    """Collective over ``group``: the host names its ranks run on."""
    hosts: list[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(hosts, socket.gethostname(), group=group)
    return set(hosts)


def agree_on_key(group: dist.ProcessGroup | None, rank: int) -> str:
    """Collective over ``group``: check that all its ranks run on this host, and return the
    key rank 0 drew for the group's segment names."""
    hosts = group_hosts(group)
    if len(hosts) != 1:
        raise ValueError(
            f"ShmTransport: the group spans hosts {sorted(hosts)}; shared memory works "
            "within one host - use transport='dist' (or a Topology) across hosts"
        )
    key = [uuid.uuid4().hex[:16] if rank == 0 else None]
    src = dist.get_global_rank(group, 0) if group is not None else 0
    dist.broadcast_object_list(key, src=src, group=group)
    return str(key[0])


def barrier(group: dist.ProcessGroup | None) -> None:
    """Every rank of ``group`` has got here."""
    flag = torch.zeros(1)
    dist.all_reduce(flag, group=group)  # gloo's barrier is an all-reduce as well


def round_up(n: int, align: int = ALIGN) -> int:
    return max(align, -(-n // align) * align)


def map_segment(path: str, nbytes: int, *, create: bool) -> torch.Tensor:
    """A uint8 tensor backed by a shared file in /dev/shm (created and sized if ``create``)."""
    if not create and not os.path.exists(path):
        raise TransportError(f"shared-memory file {path} is gone: its owner rank exited")
    if create:
        reserve(path, nbytes)
    return torch.from_file(path, shared=True, size=nbytes, dtype=torch.uint8)


def reserve(path: str, nbytes: int) -> None:
    """Create ``path`` with ``nbytes`` really allocated, so that a full /dev/shm fails here with
    a message instead of killing a rank with SIGBUS on its first write."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        os.posix_fallocate(fd, 0, max(1, nbytes))
    except OSError as err:
        unlink(path)
        st = os.statvfs(os.path.dirname(path))
        raise TransportError(
            f"cannot reserve {nbytes / 2**20:.1f} MiB of shared memory in {os.path.dirname(path)} "
            f"({err.strerror}; {st.f_bavail * st.f_frsize / 2**20:.0f} MiB free): enlarge it "
            "(docker run --shm-size=...) or use the 'dist' transport"
        ) from err
    finally:
        os.close(fd)


def unlink(path: str) -> None:
    Path(path).unlink(missing_ok=True)


def store_fence() -> None:
    """Order the row copies before the flag store (a locked instruction drains store buffers)."""
    lock = threading.Lock()
    lock.acquire()
    lock.release()


class Backoff:
    """Spin briefly, then sleep with growing pauses, until ``timeout_s`` has passed.

    :meth:`step` returns ``"spin"`` (a busy turn), ``"slept"`` (it slept up to 1 ms: a turn
    for slower checks, such as liveness) or ``"expired"`` (the deadline has passed: the
    caller raises or gives up); :meth:`extend` moves the deadline once more.
    """

    def __init__(self, timeout_s: float) -> None:
        self.start = time.monotonic()
        self.deadline = self.start + timeout_s
        self.spins = 0
        self.extended = False

    def step(self) -> str:
        self.spins += 1
        if self.spins < 64:
            return "spin"
        if time.monotonic() > self.deadline:
            return "expired"
        time.sleep(min(1e-3, 1e-6 * (self.spins - 63)))
        return "slept"

    def extend(self, seconds: float) -> None:
        self.deadline = time.monotonic() + seconds
        self.extended = True

    def waited(self) -> float:
        return time.monotonic() - self.start


def copier(segment: torch.Tensor) -> Callable[[torch.Tensor], Any]:
    return lambda slot: slot.copy_(segment.reshape(-1))


def cleanup(paths: list[str]) -> None:
    for path in paths:
        unlink(path)
