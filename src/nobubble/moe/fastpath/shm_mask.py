"""What a wait of :class:`~nobubble.moe.fastpath.shm_transport.ShmTransport` does about
silent peers: name them in a :class:`~nobubble.moe.transport.PeerFailure`, or mask them.

A wait past ``timeout_s`` names the peers whose READY or DONE never came and that also stopped
beating (a peer still beating waits for someone else: the wait is extended once, by
``timeout_s``). With ``mask_failed_ranks=True`` it votes them failed instead: ``BEAT`` and
``VOTES[j]`` in each rank's control block (one writer each). The mask is the union of every
rank's votes; it only grows, and a rank that finds itself masked raises (no rejoining).

Lifecycle per call ``t``: :meth:`PeerMask.begin` (the peers masked so far are skipped) ->
:meth:`PeerMask.idle` on every idle turn of a wait -> :attr:`PeerMask.missing` read at the end
(the sources whose rows did not arrive). See ``docs/moe/failures.md``.
"""

from __future__ import annotations

import time

import numpy as np

from nobubble.moe.fastpath.shm_segment import Backoff
from nobubble.moe.transport import PeerFailure, phase_of

__all__ = ["PeerMask"]

_STALE_S = 1.0  # a waiting rank beats every millisecond or so; one second without is silence


def _now_us() -> int:
    """``CLOCK_MONOTONIC`` in microseconds: one clock for every process of this host."""
    return time.monotonic_ns() // 1000


class PeerMask:
    """Failure detection and masking for one rank of a shared-memory group.

    Args:
        rank: this rank; ``world_size``: ``R``.
        own: this rank's control block (int64 words); ``peers``: ``{j: rank j's block}``.
        beat: offset of the ``BEAT`` word; ``votes``: offset of ``VOTES[0]`` (``R`` words).
        timeout_s: the longest a wait may take (a peer silent for ``min(1 s, timeout_s / 4)``
            is not waiting in a call).
        mask_failed_ranks: vote silent peers failed and go on, instead of raising.

    Attributes:
        missing: the peers the current call skips: masked before it began or during it.
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
        timeout_s: float,
        mask_failed_ranks: bool,
    ) -> None:
        self.rank, self.world_size = rank, world_size
        self.timeout_s = timeout_s
        self.mask_failed_ranks = mask_failed_ranks
        self.missing: frozenset[int] = frozenset()
        self._own, self._peers = own, peers
        self._beat, self._votes = beat, votes
        self._stale_us = int(min(_STALE_S, timeout_s / 4) * 1e6)
        self._blocks = [own if r == rank else peers[r] for r in range(world_size)]
        self._beat_now()

    def _beat_now(self) -> None:
        """This rank is alive and waiting in a call."""
        self._own[self._beat] = _now_us()

    def _is_stale(self, j: int) -> bool:
        """Rank ``j`` has not idled in a wait lately: it is not waiting on others."""
        return _now_us() - int(self._peers[j][self._beat]) > self._stale_us

    def masked_ranks(self) -> frozenset[int]:
        """Ranks the group has voted failed (empty unless masking is on; one read of
        ``R * R`` words)."""
        if not self.mask_failed_ranks:
            return frozenset()
        lo, hi = self._votes, self._votes + self.world_size
        votes = np.stack([block[lo:hi] for block in self._blocks])  # (R voters, R ranks)
        return frozenset(int(j) for j in np.flatnonzero(votes.any(axis=0)))

    def begin(self, t: int, kind: str) -> frozenset[int]:
        """Start call ``t``: raise if this rank is masked, skip the masked peers, beat.
        Returns the mask."""
        masked = self.masked_ranks()
        self._check_not_masked(masked, kind, t)
        self.missing = masked - {self.rank}
        self._beat_now()
        return masked

    def idle(self, backoff: Backoff, waiting: set[int], t: int, kind: str, op: str) -> set[int]:
        """One idle turn of a wait for the peers ``waiting`` at call ``t``.

        Returns the waited-for peers that are masked now (the caller stops waiting for
        them; they join :attr:`missing`); raises :class:`PeerFailure` past the deadline
        unless masking takes them out.
        """
        state = backoff.step()
        if state == "spin":
            return set()
        self._beat_now()
        masked = self.masked_ranks()
        self._check_not_masked(masked, kind, t)
        if waiting & masked:
            return self._skip(set(waiting & masked))
        if state == "slept":
            return set()
        silent = {j for j in waiting if self._is_stale(j)}
        if not silent and not backoff.extended:
            backoff.extend(self.timeout_s)  # all of them wait for someone else: give them time
            return set()
        if self.mask_failed_ranks and silent:
            for j in silent:  # declare them failed (this rank is not masked itself)
                self._own[self._votes + j] = 1
            return self._skip(silent)
        beating = sorted(waiting - silent)
        detail = f"{kind} {op} (call {t}) waiting for rank(s) {sorted(waiting)}" + (
            f"; rank(s) {beating} are alive but waiting for others" if beating else ""
        )
        raise self._failure(kind, op, t, sorted(silent or waiting), backoff.waited(), detail)

    def _skip(self, gone: set[int]) -> set[int]:
        self.missing |= gone
        return gone

    def _check_not_masked(self, masked: frozenset[int], kind: str, t: int) -> None:
        if self.rank in masked:
            raise self._failure(
                kind,
                "begin",
                t,
                [self.rank],
                0.0,
                "this rank was masked by its peers (it did not answer within the "
                "timeout and they went on without it); it cannot rejoin the group",
            )

    def _failure(
        self, kind: str, op: str, t: int, failed: list[int], waited_s: float, detail: str
    ) -> PeerFailure:
        return PeerFailure(
            rank=self.rank,
            world_size=self.world_size,
            phase=phase_of(kind),
            operation=f"{kind} {op}",
            failed_ranks=tuple(failed),
            waited_s=waited_s,
            timeout_s=self.timeout_s,
            call=t,
            detail=detail,
        )
