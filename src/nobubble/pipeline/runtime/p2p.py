"""Point-to-point transfers of a schedule: which rank sends what to whom, in what order.

Messages between stages on different ranks:

- after ``F(s, m)``: the activation, to the rank of stage ``s + 1``, key ``("act", s + 1, m)``;
- after ``B(s, m)`` / ``BW(s, m)``: the input gradient, to the rank of stage ``s - 1``, key
  ``("grad", s - 1, m)``.

Keys name the *receiving* stage. Between stages on the same rank (the turn of a V schedule)
nothing is sent; the tensor is handed over in memory.

A sender posts ``isend`` as soon as the tensor exists. A receiver posts ``irecv`` ahead of
need: before running action i it posts the receives of actions i .. i + lookahead, and from
each peer it always posts in the order that peer sends (known from the schedule), so the
matching is the same with tag-matching gloo and order-matching NCCL. Messages towards higher
ranks and towards lower ranks travel in two separate process groups, so on NCCL (one stream
per communicator and peer pair) a receive posted early never queues in front of a send the
peer is waiting for. Every wait is bounded by ``timeout_s``; a peer that never sends raises
``TimeoutError`` naming the message.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from nobubble.pipeline.actions import Action, Op, Schedule

__all__ = ["MessageKey", "P2PChannel", "expected_messages", "incoming", "outgoing", "wait_for"]


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


class P2PChannel:
    """One rank's sends and receives for one training step.

    Args:
        schedule: the schedule being run.
        rank: this rank.
        shapes: ``shapes[s]`` is the shape of stage s's input activation (s >= 1); the
            gradient received by stage s has the shape of stage s+1's input.
        dtype, device: of activations and gradients.
        timeout_s: limit for every wait.
        lookahead: how many actions ahead receives are posted.
        groups: two process groups over all ranks, one per direction (to a higher rank, to
            a lower rank); None uses the default group for both.
    """

    def __init__(
        self,
        schedule: Schedule,
        rank: int,
        *,
        shapes: dict[int, torch.Size],
        dtype: torch.dtype,
        device: torch.device,
        timeout_s: float,
        lookahead: int = 2,
        groups: tuple[dist.ProcessGroup | None, dist.ProcessGroup | None] | None = None,
    ) -> None:
        self.schedule, self.rank = schedule, rank
        self.shapes, self.dtype, self.device = shapes, dtype, device
        self.timeout = timedelta(seconds=timeout_s)
        self.lookahead = lookahead
        self.groups = groups or (None, None)
        self._actions = schedule.rank_actions[rank]
        self._expected = expected_messages(schedule, rank)
        self._posted: dict[MessageKey, tuple[torch.Tensor, dist.Work]] = {}
        self._local: dict[MessageKey, torch.Tensor] = {}
        self._sends: list[tuple[MessageKey, torch.Tensor, dist.Work]] = []

    def _group(self, src: int, dst: int) -> dist.ProcessGroup | None:
        """Messages to a higher rank go on ``groups[0]``, to a lower rank on ``groups[1]``."""
        return self.groups[0] if src < dst else self.groups[1]

    def _shape(self, key: MessageKey) -> torch.Size:
        return self.shapes[key.stage] if key.kind == "act" else self.shapes[key.stage + 1]

    def prefetch(self, position: int) -> None:
        """Post the receives of actions ``position .. position + lookahead``."""
        for a in self._actions[position : position + self.lookahead + 1]:
            need = incoming(self.schedule, a)
            if need is not None and need[1] != self.rank:
                self._post_through(need[0], need[1])

    def _post_through(self, key: MessageKey, src: int) -> None:
        if key in self._posted:
            return
        queue = self._expected.get(src)
        if not queue or key not in queue:
            raise RuntimeError(f"rank {self.rank}: no rank-{src} send matches {key}")
        s, m = self.schedule.num_stages, self.schedule.num_microbatches
        while True:
            k = queue.popleft()
            buf = torch.empty(self._shape(k), dtype=self.dtype, device=self.device)
            work = dist.irecv(buf, src=src, tag=k.tag(s, m), group=self._group(src, self.rank))
            assert work is not None  # None only for a rank outside the group; ours span all
            self._posted[k] = (buf, work)
            if k == key:
                return

    def receive(self, key: MessageKey, src: int) -> torch.Tensor:
        """The tensor for ``key``: handed over in memory (same rank) or received from ``src``."""
        if src == self.rank:
            return self._local.pop(key)
        self._post_through(key, src)
        buf, work = self._posted.pop(key)
        self._wait(work, f"receiving {key.kind} of stage {key.stage} microbatch "
                   f"{key.microbatch} from rank {src}")  # fmt: skip
        return buf

    def send(self, key: MessageKey, dst: int, tensor: torch.Tensor) -> None:
        """Post the send of ``tensor`` for ``key`` (in memory when ``dst`` is this rank)."""
        if dst == self.rank:
            self._local[key] = tensor
            return
        tensor = tensor.contiguous()
        s, m = self.schedule.num_stages, self.schedule.num_microbatches
        work = dist.isend(tensor, dst=dst, tag=key.tag(s, m), group=self._group(self.rank, dst))
        assert work is not None  # None only for a rank outside the group; ours span all
        self._sends.append((key, tensor, work))

    def finish(self) -> None:
        """Wait for every posted send; check that nothing was left unreceived."""
        for key, _, work in self._sends:
            self._wait(work, f"sending {key.kind} of stage {key.stage} microbatch {key.microbatch}")
        self._sends.clear()
        left = list(self._posted) + list(self._local)
        if left:
            raise RuntimeError(f"rank {self.rank}: step ended with unconsumed messages {left}")

    def _wait(self, work: dist.Work, what: str) -> None:
        wait_for(work, self.timeout, self.rank, what)


def wait_for(work: dist.Work, timeout: timedelta, rank: int, what: str) -> None:
    """Wait for ``work``; a timeout or a peer's failure raises TimeoutError naming ``what``."""
    try:
        work.wait(timeout)
    except RuntimeError as err:
        raise TimeoutError(
            f"rank {rank}: no progress {what} within {timeout.total_seconds():.0f}s ({err})"
        ) from err
