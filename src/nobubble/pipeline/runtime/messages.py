"""Point-to-point messages that carry their own shape and dtype, for user models.

A user's model may change shape from one microbatch to the next (variable sequence
lengths), so the receiver cannot know a boundary's shape before the step. Here every message is two sends: a header ``int64 [2 + MAX_DIMS]`` (dtype code,
number of dims, the dims) and the payload. The receiver takes messages from each source in
that source's send order (the schedule says which), one at a time: it posts the next
header, reads the shape, posts the payload. Messages from one source that arrive before
they are needed wait in memory. Per-source order keeps the matching identical with
tag-matching gloo and order-matching NCCL; directions travel in two process groups, as in
:mod:`.p2p`. Every wait is bounded by ``timeout_s``.

With a :class:`ShapeCache` (``PipelineRunner(static_shapes=True)``) a message whose key
(kind, stage, microbatch) crossed before travels without its header: both sides remember
the first step's shapes, the receiver posts the payload straight away, and a sender whose
tensor no longer matches raises before sending. One send per boundary tensor, as in
torch's runtime, which fixes shapes at its first step too.
"""

from __future__ import annotations

from datetime import timedelta

import torch
import torch.distributed as dist

from nobubble.pipeline.actions import Schedule
from nobubble.pipeline.runtime.p2p import MessageKey, expected_messages, wait_for

__all__ = ["MAX_DIMS", "ShapedChannel", "ShapeCache", "DTYPES"]

MAX_DIMS = 8
DTYPES: tuple[torch.dtype, ...] = (
    torch.float32,
    torch.float16,
    torch.bfloat16,
    torch.float64,
    torch.int64,
    torch.int32,
    torch.bool,
)
"""The dtypes a boundary tensor may have (their index is the header's dtype code)."""


class ShapeCache:
    """What crossed in earlier steps: per message key, the (dtype, shape) sent and received."""

    def __init__(self) -> None:
        self.sent: dict[MessageKey, tuple[torch.dtype, torch.Size]] = {}
        self.received: dict[MessageKey, tuple[torch.dtype, torch.Size]] = {}


class ShapedChannel:
    """One rank's sends and receives for one step of ``schedule``.

    Args:
        schedule: the schedule being run.
        rank: this rank.
        device: where received tensors are placed.
        timeout_s: limit for every wait.
        groups: two process groups over the pipeline's ranks, one per direction (to a higher
            rank, to a lower rank); None uses the default group for both. ``rank`` and the
            peers are ranks within these groups.
        shapes: the runner's cache across steps (None: every message carries its header).
    """

    def __init__(
        self,
        schedule: Schedule,
        rank: int,
        *,
        device: torch.device,
        timeout_s: float,
        groups: tuple[dist.ProcessGroup | None, dist.ProcessGroup | None] | None = None,
        shapes: ShapeCache | None = None,
    ) -> None:
        self.schedule, self.rank, self.device = schedule, rank, device
        self.shapes = shapes
        self.timeout = timedelta(seconds=timeout_s)
        self.groups = groups or (None, None)
        self._expected = expected_messages(schedule, rank)
        # per source, the next message's receive: its header, or (cached shape) its payload
        self._header: dict[int, tuple[MessageKey, torch.Tensor, dist.Work]] = {}
        self._payload: dict[int, tuple[MessageKey, torch.Tensor, dist.Work]] = {}
        self._arrived: dict[MessageKey, torch.Tensor] = {}
        self._local: dict[MessageKey, torch.Tensor] = {}
        self._sends: list[tuple[MessageKey, list[torch.Tensor], list[dist.Work]]] = []
        for src in self._expected:
            self._post_header(src)

    def _group(self, src: int, dst: int) -> dist.ProcessGroup | None:
        return self.groups[0] if src < dst else self.groups[1]

    def _tags(self, key: MessageKey) -> tuple[int, int]:
        tag = key.tag(self.schedule.num_stages, self.schedule.num_microbatches)
        return 2 * tag, 2 * tag + 1

    def _post_header(self, src: int) -> None:
        queue = self._expected.get(src)
        if not queue:
            return
        key = queue.popleft()
        known = self.shapes.received.get(key) if self.shapes is not None else None
        if known is not None:  # no header: the payload's receive is posted right away
            payload = torch.empty(known[1], dtype=known[0], device=self.device)
            got = dist.irecv(
                payload, group_src=src, tag=self._tags(key)[1], group=self._group(src, self.rank)
            )
            assert got is not None
            self._payload[src] = (key, payload, got)
            return
        buf = torch.empty(2 + MAX_DIMS, dtype=torch.int64, device=self.device)
        work = dist.irecv(
            buf, group_src=src, tag=self._tags(key)[0], group=self._group(src, self.rank)
        )
        assert work is not None  # None only for a rank outside the group; ours span all
        self._header[src] = (key, buf, work)

    def _take_next(self, src: int) -> MessageKey:
        """Receive the next message from ``src`` (header, then payload); returns its key."""
        if src in self._payload:
            key, payload, work = self._payload.pop(src)
            self._wait(work, f"receiving {key.kind} of stage {key.stage} microbatch "
                            f"{key.microbatch} from rank {src}")  # fmt: skip
            self._arrived[key] = payload
            self._post_header(src)
            return key
        if src not in self._header:
            raise RuntimeError(f"rank {self.rank}: no more messages expected from rank {src}")
        key, header, work = self._header.pop(src)
        what = f"{key.kind} of stage {key.stage} microbatch {key.microbatch} from rank {src}"
        self._wait(work, f"receiving the header of {what}")
        code, ndim, *dims = header.tolist()
        payload = torch.empty(dims[:ndim], dtype=DTYPES[code], device=self.device)
        got = dist.irecv(
            payload, group_src=src, tag=self._tags(key)[1], group=self._group(src, self.rank)
        )
        assert got is not None
        self._wait(got, f"receiving {what}")
        if self.shapes is not None:
            self.shapes.received[key] = (payload.dtype, payload.shape)
        self._arrived[key] = payload
        self._post_header(src)
        return key

    def receive(self, key: MessageKey, src: int) -> torch.Tensor:
        """The tensor for ``key``: handed over in memory (same rank) or received from ``src``."""
        if src == self.rank:
            return self._local.pop(key)
        while key not in self._arrived:
            self._take_next(src)
        return self._arrived.pop(key)

    def send(self, key: MessageKey, dst: int, tensor: torch.Tensor) -> None:
        """Post the send of ``tensor`` for ``key`` (in memory when ``dst`` is this rank)."""
        if dst == self.rank:
            self._local[key] = tensor
            return
        if tensor.dtype not in DTYPES or tensor.dim() > MAX_DIMS:
            raise ValueError(
                f"stage {key.stage - 1 if key.kind == 'act' else key.stage + 1} sends a "
                f"{tensor.dtype} tensor of {tensor.dim()} dims; a boundary tensor needs one of "
                f"{[str(d).removeprefix('torch.') for d in DTYPES]} and at most {MAX_DIMS} dims"
            )
        tensor = tensor.detach().contiguous()
        group = self._group(self.rank, dst)
        h_tag, p_tag = self._tags(key)
        if self.shapes is not None and key in self.shapes.sent:
            self._check_static(key, tensor)
            work = dist.isend(tensor, group_dst=dst, tag=p_tag, group=group)
            assert work is not None
            self._sends.append((key, [tensor], [work]))
            return
        if self.shapes is not None:
            self.shapes.sent[key] = (tensor.dtype, tensor.shape)
        header = torch.zeros(2 + MAX_DIMS, dtype=torch.int64)
        header[0], header[1] = DTYPES.index(tensor.dtype), tensor.dim()
        header[2 : 2 + tensor.dim()] = torch.tensor(tensor.shape, dtype=torch.int64)
        header = header.to(self.device)
        works = [dist.isend(header, group_dst=dst, tag=h_tag, group=group),
                 dist.isend(tensor, group_dst=dst, tag=p_tag, group=group)]  # fmt: skip
        assert all(w is not None for w in works)
        self._sends.append((key, [header, tensor], [w for w in works if w is not None]))

    def _check_static(self, key: MessageKey, tensor: torch.Tensor) -> None:
        dtype, shape = self.shapes.sent[key] if self.shapes is not None else (None, None)
        if (tensor.dtype, tensor.shape) != (dtype, shape):
            raise ValueError(
                f"static_shapes: {key.kind} of stage {key.stage} microbatch {key.microbatch} "
                f"is {tensor.dtype} {tuple(tensor.shape)}, but was {dtype} {tuple(shape or ())} "
                "in the first step; use PipelineRunner(static_shapes=False) for shapes that change"
            )

    def finish(self) -> None:
        """Wait for every posted send; check that nothing was left unreceived."""
        for key, _, works in self._sends:
            for work in works:
                self._wait(
                    work, f"sending {key.kind} of stage {key.stage} microbatch {key.microbatch}"
                )
        self._sends.clear()
        left = [k for k, *_ in (*self._header.values(), *self._payload.values())]
        left += list(self._arrived) + list(self._local)
        if left:
            raise RuntimeError(f"rank {self.rank}: step ended with unconsumed messages {left}")

    def _wait(self, work: dist.Work, what: str) -> None:
        wait_for(work, self.timeout, self.rank, what)
