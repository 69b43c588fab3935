"""Point-to-point transfers of a schedule: which rank sends what to whom, in what order.

Messages between stages on different ranks:

- after ``F(s, m)``: the activation, to the rank of stage ``s + 1``, key ``("act", s + 1, m)``;
- after ``B(s, m)`` / ``BW(s, m)``: the input gradient, to the rank of stage ``s - 1``, key
  ``("grad", s - 1, m)``.

Keys name the *receiving* stage. Between stages on the same rank (the turn of a V schedule)
nothing is sent; the tensor is handed over in memory.

Messages towards higher ranks and towards lower ranks travel in two separate process
groups, so on NCCL (one stream per communicator and peer pair) a receive posted early never
queues in front of a send the peer is waiting for; from each peer, receives are posted in the
order that peer sends (known from the schedule), so the matching is the same with
tag-matching gloo and order-matching NCCL (:mod:`.messages` carries the tensors). Every wait
is bounded; a peer that never sends raises ``TimeoutError`` naming the message.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from datetime import timedelta

import torch.distributed as dist

from nobubble.pipeline.actions import Action, Op, Schedule

__all__ = ["MessageKey", "expected_messages", "incoming", "outgoing", "wait_for", "global_rank"]


@dataclass(frozen=True, slots=True)
class MessageKey:
    """A transfer: ``kind`` "act" (forward activation) or "grad" (input gradient), the
    receiving ``stage`` and the ``microbatch``."""

    kind: str
    stage: int
    microbatch: int

    def tag(self, num_stages: int, num_microbatches: int) -> int:
        kind_id = 0 if self.kind == "act" else 1
        return (kind_id * num_stages + self.stage) * num_microbatches + self.microbatch


def outgoing(schedule: Schedule, action: Action) -> tuple[MessageKey, int] | None:
    """The message ``action`` produces for another stage and the destination rank, if any
    (also returned when that stage is on the same rank; callers hand it over in memory)."""
    s, m = action.stage, action.microbatch
    if action.op is Op.F and s < schedule.num_stages - 1:
        return MessageKey("act", s + 1, m), schedule.rank_of(s + 1)
    if action.op.is_backward and s > 0:
        return MessageKey("grad", s - 1, m), schedule.rank_of(s - 1)
    return None


def expected_messages(schedule: Schedule, rank: int) -> dict[int, deque[MessageKey]]:
    """Per source rank: the keys it sends to ``rank``, in the order it sends them."""
    out: dict[int, deque[MessageKey]] = {}
    for src, acts in enumerate(schedule.rank_actions):
        if src == rank:
            continue
        for a in acts:
            msg = outgoing(schedule, a)
            if msg is not None and msg[1] == rank:
                out.setdefault(src, deque()).append(msg[0])
    return out


def incoming(schedule: Schedule, action: Action) -> tuple[MessageKey, int] | None:
    """The message ``action`` needs from another stage and the source rank, if any."""
    s, m = action.stage, action.microbatch
    if action.op is Op.F and s > 0:
        return MessageKey("act", s, m), schedule.rank_of(s - 1)
    if action.op.is_backward and s < schedule.num_stages - 1:
        return MessageKey("grad", s, m), schedule.rank_of(s + 1)
    return None


def wait_for(work: dist.Work, timeout: timedelta, rank: int, what: str) -> None:
    """Wait for ``work``; a timeout or a peer's failure raises TimeoutError naming ``what``."""
    try:
        work.wait(timeout)
    except RuntimeError as err:
        raise TimeoutError(
            f"rank {rank}: no progress {what} within {timeout.total_seconds():.0f}s ({err})"
        ) from err


def global_rank(group: dist.ProcessGroup | None, group_rank: int) -> int:
    """The global rank of ``group_rank`` in ``group`` (itself for the default group), as
    torch's collectives and point-to-point calls take it."""
    return group_rank if group is None else dist.get_global_rank(group, group_rank)
