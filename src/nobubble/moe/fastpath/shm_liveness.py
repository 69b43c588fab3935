"""Who is alive and who is masked: heartbeats and failure votes in shared control blocks.

Every rank of a :class:`~nobubble.moe.fastpath.shm_transport.ShmTransport` owns a control
block that all its peers have mapped. Two parts of it serve failure handling, each word with
exactly one writer (the owner), so no atomics are needed:

- ``BEAT``: the monotonic clock (microseconds, the same clock for every process of a host)
  when the owner last idled in a wait. A peer that is waiting for someone else keeps beating;
  one that died, hangs in user code or computes past the timeout does not.
- ``VOTES[j]``: 1 once the owner has declared rank ``j`` failed.

The *mask* is the union of every rank's votes (the dead rank's block stays mapped and
readable). Every rank reads the same words, so the survivors agree on it by their next
call (within one call, a peer masked late may still be seen by some survivors and not by
others; the buffer re-reads the mask after each exchange); a vote is never withdrawn, so
the mask only grows - DeepEP's low-latency mask buffer, on a host. A rank that
finds itself in the mask (it was too slow and the others went on) must not vote or rejoin.
"""

from __future__ import annotations

import time

import numpy as np

__all__ = ["PeerLiveness", "now_us"]


def now_us() -> int:
    """``CLOCK_MONOTONIC`` in microseconds: one clock for every process of this host."""
    return time.monotonic_ns() // 1000


class PeerLiveness:
    """Heartbeats and failure votes of one group.

    Args:
        rank: this rank; ``world_size``: ``R``.
        own: this rank's control block (int64 words).
        peers: ``{j: control block of rank j}`` for every other rank.
        beat: offset of the ``BEAT`` word; ``votes``: offset of ``VOTES[0]`` (``R`` words).
        stale_s: a peer whose last beat is older than this is not waiting in a call.
    """

    def __init__(
        self,
        rank: int,
        world_size: int,
        own: np.ndarray,
        peers: dict[int, np.ndarray],
        *,
        beat: int,
        votes: int,
        stale_s: float,
    ) -> None:
        self.rank, self.world_size = rank, world_size
        self._own, self._peers = own, peers
        self._beat, self._votes = beat, votes
        self._stale_us = int(stale_s * 1e6)
        self._blocks = [own if r == rank else peers[r] for r in range(world_size)]
        self.beat()

    def beat(self) -> None:
        """This rank is alive and waiting in a call."""
        self._own[self._beat] = now_us()

    def is_stale(self, j: int) -> bool:
        """Rank ``j`` has not idled in a wait for ``stale_s``: it is not waiting on others."""
        return now_us() - int(self._peers[j][self._beat]) > self._stale_us

    def masked(self) -> frozenset[int]:
        """Ranks some rank has voted failed (one read of ``R * R`` words)."""
        lo, hi = self._votes, self._votes + self.world_size
        votes = np.stack([block[lo:hi] for block in self._blocks])  # (R voters, R ranks)
        return frozenset(int(j) for j in np.flatnonzero(votes.any(axis=0)))

    def vote(self, ranks: set[int] | frozenset[int]) -> None:
        """Declare ``ranks`` failed (this rank must not be masked itself)."""
        for j in ranks:
            self._own[self._votes + j] = 1
