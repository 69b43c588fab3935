"""What a Buffer does about masked ranks: re-route their top-k slots to replicas, or drop them.

For every (token, slot) pair routed to an expert on a rank that a
:class:`~nobubble.moe.transport.FailureMasking` transport masked, the buffer re-routes it to a
surviving replica of the same logical expert when it knows the placement
(``Buffer.set_replicas(phy2log)``), else drops it (its weighted output and weight are missing
from the combined sums; the others are not renormalised). Pairs are counted where they are
lost: at dispatch for a rank masked before planning (a rank masked during planning is
dropped, never re-routed), at combine for a rank whose rows did not come back.
:class:`MaskingStats` reports the totals; :class:`MaskLedger` applies the pure functions here
at each step. See ``docs/moe/failures.md``.

Shape legend: ``N`` tokens, ``K`` top-k, ``E`` physical experts, ``R`` ranks, ``L = E / R``
experts per rank, ``C`` surviving replicas, ``M`` received rows.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import cast

import torch

from nobubble.moe.layout import DispatchLayout, get_dispatch_layout, num_local_experts
from nobubble.moe.transport import FailureMasking, Transport, capabilities_of

__all__ = [
    "MaskLedger",
    "MaskingStats",
    "drop_slots_on_ranks",
    "reroute_to_replicas",
    "surviving_replicas",
    "without_sources",
]


@dataclass(frozen=True)
class MaskingStats:
    """What masking cost one rank since its :class:`~nobubble.moe.buffer.Buffer` was made.

    Attributes:
        masked_ranks: the ranks the group has masked, sorted.
        num_dropped: (token, slot) pairs of this rank's tokens that lost their expert, in all.
        num_dropped_in_flight: the part of ``num_dropped`` lost at combine: dispatched to a
            rank that failed before it sent its rows back.
        num_rerouted: pairs sent to a surviving replica instead of a masked rank's expert.
    """

    masked_ranks: tuple[int, ...] = ()
    num_dropped: int = 0
    num_dropped_in_flight: int = 0
    num_rerouted: int = 0


def _on_ranks(topk_idx: torch.Tensor, ranks: Iterable[int], experts_per_rank: int) -> torch.Tensor:
    """``[N, K]`` bool: the slot's expert lives on one of ``ranks`` (empty slots never)."""
    ranks_t = torch.tensor(sorted(ranks), dtype=torch.int64, device=topk_idx.device)
    owner = torch.where(topk_idx >= 0, topk_idx // experts_per_rank, -1)  # (N, K)
    return torch.isin(owner, ranks_t)


def drop_slots_on_ranks(
    topk_idx: torch.Tensor, ranks: Iterable[int], experts_per_rank: int
) -> tuple[torch.Tensor, int]:
    """``topk_idx [N, K]`` with the slots on ``ranks`` emptied (-1), and how many there were."""
    ranks = list(ranks)
    if not ranks:
        return topk_idx, 0
    hit = _on_ranks(topk_idx, ranks, experts_per_rank)  # (N, K)
    return topk_idx.masked_fill(hit, -1), int(hit.sum())


def surviving_replicas(
    phy2log: torch.Tensor, masked_ranks: Iterable[int], experts_per_rank: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """For every physical expert, the physical replicas of its logical expert off masked ranks.

    Args:
        phy2log: ``[E]`` int64, the logical expert of each physical expert.
        masked_ranks: ranks whose experts are gone.
        experts_per_rank: ``L``.
    Returns:
        ``(alt [E, C], num_alt [E])``: ``alt[p, :num_alt[p]]`` are the surviving physical
        replicas of ``phy2log[p]`` in ascending order (-1 padding).
    """
    phy2log = phy2log.long().cpu()
    num_physical = phy2log.shape[0]
    alive = ~_on_ranks(torch.arange(num_physical).view(1, -1), masked_ranks, experts_per_rank)[0]
    same = phy2log.view(-1, 1) == phy2log.view(1, -1)  # (E, E): same logical expert
    ok = same & alive.view(1, -1)  # (E, E): q is a surviving replica of p's logical expert
    num_alt = ok.sum(dim=1)  # (E,)
    width = max(1, int(num_alt.max()) if num_physical else 1)
    # stable sort puts the surviving replicas first, in ascending physical id
    order = torch.sort((~ok).to(torch.int8), dim=1, stable=True).indices[:, :width]  # (E, C)
    cols = torch.arange(width).view(1, -1)
    alt = torch.where(cols < num_alt.view(-1, 1), order, -1)  # (E, C)
    return alt, num_alt


def reroute_to_replicas(
    topk_idx: torch.Tensor,
    phy2log: torch.Tensor,
    masked_ranks: Iterable[int],
    experts_per_rank: int,
) -> tuple[torch.Tensor, int, int]:
    """Send the slots on masked ranks to surviving replicas; drop those that have none.

    The replica of slot ``(n, k)`` is ``alt[p, (n + k) % num_alt[p]]`` (see
    :func:`surviving_replicas`): deterministic, spread over the replicas by token.

    Args:
        topk_idx: ``[N, K]`` int64 physical expert ids, -1 = empty.
        phy2log: ``[E]`` the placement; masked_ranks, experts_per_rank: as above.
    Returns:
        ``(new topk_idx [N, K], num_rerouted, num_dropped)``.
    """
    masked_ranks = list(masked_ranks)
    if not masked_ranks:
        return topk_idx, 0, 0
    hit = _on_ranks(topk_idx, masked_ranks, experts_per_rank)  # (N, K)
    alt, num_alt = surviving_replicas(phy2log, masked_ranks, experts_per_rank)
    alt, num_alt = alt.to(topk_idx.device), num_alt.to(topk_idx.device)
    n = torch.arange(topk_idx.shape[0], device=topk_idx.device).view(-1, 1)
    k = torch.arange(topk_idx.shape[1], device=topk_idx.device).view(1, -1)
    p = topk_idx.clamp(min=0)  # (N, K), empty slots read expert 0 and are not hit
    count = num_alt[p]  # (N, K)
    pick = alt[p, (n + k) % count.clamp(min=1)]  # (N, K), -1 where no replica survives
    new = torch.where(hit, pick, topk_idx)
    num_rerouted = int((hit & (count > 0)).sum())
    return new, num_rerouted, int(hit.sum()) - num_rerouted


def without_sources(
    recv: torch.Tensor, num_recv: list[int], gone: frozenset[int]
) -> tuple[torch.Tensor, list[int]]:
    """Remove the rows of sources in ``gone`` from ``recv [M, *]`` (grouped by source)."""
    keep, start = [], 0
    for i, n in enumerate(num_recv):
        if i not in gone:
            keep.append(recv[start : start + n])
        start += n
    return torch.cat(keep), [0 if i in gone else n for i, n in enumerate(num_recv)]


class MaskLedger:
    """One buffer's dealings with masked ranks: what it re-routed and dropped, and a warning once
    per masked rank.

    Args:
        rank: the buffer's rank.
        transport: masking is on when it declares ``Capabilities(masks_failed_ranks=True)``;
            otherwise :meth:`masked` is always empty.
    """

    def __init__(self, rank: int, transport: Transport) -> None:
        self.rank, self.num_ranks = rank, transport.world_size
        masking = capabilities_of(transport).masks_failed_ranks
        self._transport = cast(FailureMasking, transport) if masking else None
        self.enabled = masking
        self._phy2log: torch.Tensor | None = None
        self._stats = MaskingStats()
        self._reported: frozenset[int] = frozenset()
        self._missing_rows: dict[str, frozenset[int]] = {}  # per kind, in the latest combine

    def set_replicas(self, phy2log: torch.Tensor | None) -> None:
        """``[E]`` physical -> logical map for re-routing (None: drop instead)."""
        if phy2log is not None:
            if not isinstance(phy2log, torch.Tensor) or phy2log.dim() != 1:
                raise ValueError(
                    f"set_replicas: phy2log must be a [num_physical_experts] tensor, got "
                    f"{getattr(phy2log, 'shape', type(phy2log).__name__)}"
                )
            num_local_experts(phy2log.shape[0], self.num_ranks)
        self._phy2log = None if phy2log is None else phy2log.detach().long().cpu()

    def masked(self) -> frozenset[int]:
        if not self.enabled or self._transport is None:
            return frozenset()
        return self._transport.masked_ranks()

    def stats(self) -> MaskingStats:
        return replace(self._stats, masked_ranks=tuple(sorted(self.masked())))

    # -- dispatch: before and after each exchange of the plan -------------------------------
    def avoid(
        self,
        topk_idx: torch.Tensor,
        layout: DispatchLayout,
        seen: frozenset[int],
        num_experts: int,
        *,
        reroute: bool = False,
    ) -> tuple[torch.Tensor, DispatchLayout, frozenset[int]]:
        """Take the slots of ranks masked since ``seen`` out of ``topk_idx`` (re-routed when the
        replicas are known, else dropped; counted) and recompute ``layout``.

        Args:
            topk_idx: ``[N, K]`` int64 physical expert ids; layout: its layout.
            seen: the mask the caller already acted on; num_experts: ``E``.
        Returns:
            ``(topk_idx [N, K], layout, the mask now)``, the first two unchanged when no rank
            was masked since ``seen``.
        """
        masked = self.masked()
        new = masked - seen
        if not new:
            return topk_idx, layout, masked
        self._report(new, stacklevel=5)  # _report < avoid < Buffer._plan < dispatch < user
        experts_per_rank = num_local_experts(num_experts, self.num_ranks)
        if reroute and self._phy2log is not None:
            topk_idx, rerouted, dropped = reroute_to_replicas(
                topk_idx, self._phy2log, new, experts_per_rank
            )
            self._count(dropped=dropped, rerouted=rerouted)
        else:
            topk_idx, dropped = drop_slots_on_ranks(topk_idx, new, experts_per_rank)
            self._count(dropped=dropped)
        return topk_idx, get_dispatch_layout(topk_idx, num_experts, self.num_ranks), masked

    # -- combine: rows that did not come back -----------------------------------------------
    def begin_combine(self) -> None:
        """Forget the sources missing in earlier combines."""
        self._missing_rows = {}

    def note_missing_rows(self, kind: str) -> None:
        """After a combine-direction transport call for ``kind``: remember which sources'
        rows did not arrive (they read as zeros)."""
        if self.enabled and self._transport is not None:
            self._missing_rows[kind] = self._transport.missing_in_last_call()

    def count_lost_in_flight(self, topk_idx: torch.Tensor | None, num_experts: int) -> None:
        """After ``Buffer.combine``: the slots of ``topk_idx [N, K]`` (as dispatched) on ranks
        whose ``x`` rows did not come back are dropped now; count them."""
        lost = self._missing_rows.get("x", frozenset())
        if not lost or topk_idx is None:
            return
        self._report(lost, stacklevel=4)  # _report < count_lost_in_flight < combine < user
        experts_per_rank = num_local_experts(num_experts, self.num_ranks)
        self._count(in_flight=drop_slots_on_ranks(topk_idx, lost, experts_per_rank)[1])

    def _count(self, *, dropped: int = 0, in_flight: int = 0, rerouted: int = 0) -> None:
        s = self._stats
        self._stats = replace(
            s,
            num_dropped=s.num_dropped + dropped + in_flight,
            num_dropped_in_flight=s.num_dropped_in_flight + in_flight,
            num_rerouted=s.num_rerouted + rerouted,
        )

    def _report(self, ranks: frozenset[int], *, stacklevel: int) -> None:
        new = ranks - self._reported
        self._reported |= new
        if new:
            warnings.warn(
                f"rank {self.rank}: rank(s) {sorted(new)} failed and are masked; their "
                "experts' top-k slots are re-routed to replicas or dropped "
                "(Buffer.masking_stats() counts them)",
                RuntimeWarning,
                stacklevel=stacklevel,
            )
