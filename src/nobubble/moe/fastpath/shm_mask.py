"""What a wait of :class:`~nobubble.moe.fastpath.shm_transport.ShmTransport` does about
silent peers: name them in a :class:`~nobubble.moe.transport.PeerFailure`, or mask them.

A wait that passes ``timeout_s`` names exactly the peers whose READY or DONE never came -
those that also stopped beating (:mod:`.shm_liveness`; a peer still beating is itself
waiting for someone else, so the wait is extended once, by ``timeout_s``, for it to time out
on its own) - and raises :class:`~nobubble.moe.transport.PeerFailure` with them as
``failed_ranks``. With ``mask_failed_ranks=True`` it votes them failed instead; every rank
then skips masked peers (their rows read as zeros, nothing is written to them), the current
call completes, and :class:`~nobubble.moe.buffer.Buffer` drops or re-routes the top-k slots
they held (:class:`~nobubble.moe.transport.FailureMasking`). A rank that finds itself
masked raises: it cannot rejoin.

Lifecycle per call ``t``: :meth:`PeerMask.begin` (the peers masked so far are skipped) ->
:meth:`PeerMask.idle` on every idle turn of a wait (peers masked now join the skipped ones)
-> :attr:`PeerMask.missing` read at the end (the sources whose rows did not arrive).
"""

from __future__ import annotations

import numpy as np

from nobubble.moe.fastpath.shm_liveness import PeerLiveness
from nobubble.moe.fastpath.shm_segment import Backoff
from nobubble.moe.transport import PeerFailure, phase_of

__all__ = ["PeerMask"]

_STALE_S = 1.0  # a waiting rank beats every millisecond or so; one second without is silence


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
        self._live = PeerLiveness(
            rank,
            world_size,
            own,
            peers,
            beat=beat,
            votes=votes,
            stale_s=min(_STALE_S, timeout_s / 4),
        )

    def masked_ranks(self) -> frozenset[int]:
        """Ranks the group has voted failed (empty unless masking is on)."""
        return self._live.masked() if self.mask_failed_ranks else frozenset()

    def begin(self, t: int, kind: str) -> frozenset[int]:
        """Start call ``t``: raise if this rank is masked, skip the masked peers, beat.
        Returns the mask."""
        masked = self.masked_ranks()
        self._check_not_masked(masked, kind, t)
        self.missing = masked - {self.rank}
        self._live.beat()
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
        self._live.beat()
        masked = self.masked_ranks()
        self._check_not_masked(masked, kind, t)
        if waiting & masked:
            return self._skip(set(waiting & masked))
        if state == "slept":
            return set()
        silent = {j for j in waiting if self._live.is_stale(j)}
        if not silent and not backoff.extended:
            backoff.extend(self.timeout_s)  # all of them wait for someone else: give them time
            return set()
        if self.mask_failed_ranks and silent:
            self._live.vote(silent)
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
            failed_ranks=failed,
            waited_s=waited_s,
            timeout_s=self.timeout_s,
            call=t,
            detail=detail,
        )
