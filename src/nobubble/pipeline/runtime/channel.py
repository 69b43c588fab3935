"""The one point-to-point channel of a pipeline step, for static and handshake dispatch.

After ``F(s, m)`` the activation goes to stage ``s + 1``'s rank, key ``("act", s + 1, m)``;
after ``B(s, m)`` / ``BW(s, m)`` the input gradient to stage ``s - 1``'s rank, key
``("grad", s - 1, m)``; between stages on one rank the tensor is handed over in memory. A
message is a header ``int64 [5 + MAX_DIMS]`` (kind 0 act / 1 grad, receiving stage,
microbatch, dtype code, number of dims, the dims; one tag per direction) and the payload
(the key's own tag). With ``ordered`` (static dispatch) the receiver checks each header's
key against the row's order, and with a :class:`ShapeCache` a key seen in an earlier step
travels without its header (a tensor that no longer matches raises before sending).

Lifecycle per source rank, receiving side: ``POSTED`` (the one receive posted for that
source) -> ``ARRIVED`` (in the mailbox by key; the next receive posted) -> ``TAKEN``
(:meth:`Channel.receive`). Invariant: while a source still owes this rank messages, one
receive is posted for it, in its send order, so every send finds its receive whatever the
op order (with gloo and NCCL; the two directions use two process groups). Handshake
(unordered): a receiver thread per source blocks in gloo's ``wait``; :meth:`Channel.poll`
only looks at the mailbox, :meth:`Channel.wait` sleeps on it. Static (``ordered``): no
threads; :meth:`Channel.receive` waits in the rank's own thread for the posted receives of
its source until the key is in (a thread's hand-over costs a GIL switch per message, 10% of
a 1F1B step on CPU). Every wait is bounded by ``timeout_s``; a receiver's failure (a
timeout, a dead peer) is raised in the rank's thread.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from nobubble.pipeline.actions import Action, Op, Schedule

__all__ = ["Channel", "ShapeCache", "MessageKey", "MAX_DIMS", "DTYPES", "HEADER_LEN",
           "outgoing", "incoming", "expected_messages", "wait_for", "global_rank"]  # fmt: skip

MAX_DIMS = 8
HEADER_LEN = 5 + MAX_DIMS
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
_HEADER_TAG = 0  # every header of a direction; payloads use 1 + the key's tag
_KINDS = ("act", "grad")


@dataclass(frozen=True, slots=True)
class MessageKey:
    """A transfer: ``kind`` "act" (forward activation) or "grad" (input gradient), the
    receiving ``stage`` and the ``microbatch``."""

    kind: str
    stage: int
    microbatch: int

    def tag(self, num_stages: int, num_microbatches: int) -> int:
        kind_id = _KINDS.index(self.kind)
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


def incoming(schedule: Schedule, action: Action) -> tuple[MessageKey, int] | None:
    """The message ``action`` needs from another stage and the source rank, if any."""
    s, m = action.stage, action.microbatch
    if action.op is Op.F and s > 0:
        return MessageKey("act", s, m), schedule.rank_of(s - 1)
    if action.op.is_backward and s < schedule.num_stages - 1:
        return MessageKey("grad", s, m), schedule.rank_of(s + 1)
    return None


def expected_messages(schedule: Schedule, rank: int) -> dict[int, list[MessageKey]]:
    """Per source rank: the keys it sends to ``rank``, in the order its row sends them."""
    out: dict[int, list[MessageKey]] = {}
    for src, acts in enumerate(schedule.rank_actions):
        if src == rank:
            continue
        for a in acts:
            msg = outgoing(schedule, a)
            if msg is not None and msg[1] == rank:
                out.setdefault(src, []).append(msg[0])
    return out


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


class ShapeCache:
    """What crossed in earlier steps: per message key, the (dtype, shape) sent and received."""

    def __init__(self) -> None:
        self.sent: dict[MessageKey, tuple[torch.dtype, torch.Size]] = {}
        self.received: dict[MessageKey, tuple[torch.dtype, torch.Size]] = {}


class Channel:
    """One rank's sends and receives for one step of ``schedule`` (module docstring).

    Args:
        schedule: the plan (it says which keys come from which source).
        rank: this rank (within ``groups``).
        device: where received tensors are placed.
        timeout_s: limit for every wait.
        groups: two process groups over the pipeline's ranks, one per direction (to a
            higher rank, to a lower rank); None uses the default group for both.
        ordered: every rank sends in its row's order (static dispatch); False: in any order.
        shapes: the runner's cache across steps (None: every message carries its header);
            needs ``ordered``.
    """

    def __init__(
        self,
        schedule: Schedule,
        rank: int,
        *,
        device: torch.device,
        timeout_s: float,
        groups: tuple[dist.ProcessGroup | None, dist.ProcessGroup | None] | None = None,
        ordered: bool = True,
        shapes: ShapeCache | None = None,
    ) -> None:
        if shapes is not None and not ordered:
            raise ValueError("Channel: shapes (static_shapes) need ordered=True (static "
                             "dispatch); a handshake receiver learns each key from its header")  # fmt: skip
        self.schedule, self.rank, self.device = schedule, rank, device
        self.ordered, self.shapes = ordered, shapes
        self.timeout = timedelta(seconds=timeout_s)
        self.groups = groups or (None, None)
        self._owed = expected_messages(schedule, rank)  # per source, in its send order
        self._arrived: dict[MessageKey, torch.Tensor] = {}  # ARRIVED (the mailbox)
        self._local: dict[MessageKey, torch.Tensor] = {}  # same-rank handovers
        self._sends: list[tuple[MessageKey, list[torch.Tensor], list[dist.Work]]] = []
        self._news = threading.Condition()  # guards _arrived, _owed, _count, _errors
        self._count = self._seen = 0  # tensors filed so far / when poll last looked
        self._errors: list[BaseException] = []
        # ordered: per source, the receive posted for its next message (header or payload)
        self._posted: dict[int, tuple[MessageKey, torch.Tensor, dist.Work, bool]] = {}
        self._threads = [
            threading.Thread(target=self._receive_from, args=(src, len(keys)), daemon=True,
                             name=f"rank{rank}-from{src}")
            for src, keys in self._owed.items()
        ] if not ordered else []  # fmt: skip
        for t in self._threads:
            t.start()
        for src in self._owed if ordered else ():
            self._post(src)

    def _group(self, src: int, dst: int) -> dist.ProcessGroup | None:
        return self.groups[0] if src < dst else self.groups[1]

    def _payload_tag(self, key: MessageKey) -> int:
        return 1 + key.tag(self.schedule.num_stages, self.schedule.num_microbatches)

    def _receive_from(self, src: int, num_messages: int) -> None:
        """Receiver thread: ``num_messages`` messages from ``src``, in the order ``src``
        sends them, each filed in the mailbox as it comes."""
        try:
            for _ in range(num_messages):
                key, payload = self._receive_one(src)
                with self._news:
                    self._arrived[key] = payload
                    self._count += 1
                    self._news.notify_all()
        except BaseException as err:  # handed to the rank's thread, which raises it
            with self._news:
                self._errors.append(err)
                self._news.notify_all()

    def _post(self, src: int) -> None:
        """Ordered: post the receive of ``src``'s next message: its payload if its shape is
        cached, else its header."""
        if not self._owed[src]:
            return
        key = self._owed[src][0]
        known = self.shapes.received.get(key) if self.shapes is not None else None
        dtype, shape = known or (torch.int64, torch.Size([HEADER_LEN]))
        buf = torch.empty(shape, dtype=dtype, device=self.device)
        tag = self._payload_tag(key) if known is not None else _HEADER_TAG
        work = dist.irecv(buf, group_src=src, tag=tag, group=self._group(src, self.rank))
        assert work is not None  # None only for a rank outside the group; ours span all
        self._posted[src] = (key, buf, work, known is not None)

    def _take_posted(self, src: int) -> None:
        """Ordered: wait for ``src``'s posted message (and its payload after a header), file
        it in the mailbox, post the next one."""
        key, buf, work, is_payload = self._posted.pop(src)
        if not is_payload:
            wait_for(work, self.timeout, self.rank, f"receiving a header from rank {src}")
            got = self._decode(buf, src, key)
            buf = torch.empty(got[1], dtype=got[0], device=self.device)
            payload = dist.irecv(buf, group_src=src, tag=self._payload_tag(key),
                                 group=self._group(src, self.rank))  # fmt: skip
            assert payload is not None
            work = payload
        wait_for(work, self.timeout, self.rank, f"receiving {key} from rank {src}")
        if self.shapes is not None:
            self.shapes.received[key] = (buf.dtype, buf.shape)
        self._owed[src].pop(0)
        self._arrived[key] = buf
        self._count += 1
        self._post(src)

    def _decode(
        self, header: torch.Tensor, src: int, expected: MessageKey | None
    ) -> tuple[torch.dtype, torch.Size, MessageKey]:
        """A header's dtype, shape and key; RuntimeError if it is not the ``expected`` key."""
        kind, stage, mb, code, ndim, *dims = header.tolist()
        key = MessageKey(_KINDS[kind], stage, mb)
        if expected not in (None, key):
            raise RuntimeError(f"rank {self.rank}: rank {src} sent {key} where its schedule "
                               f"row sends {expected}")  # fmt: skip
        return DTYPES[code], torch.Size(dims[:ndim]), key

    def _receive_one(self, src: int) -> tuple[MessageKey, torch.Tensor]:
        """Unordered (a receiver thread): the next message from ``src``, whichever key it
        is: its header, then its payload. Returns its key and tensor."""
        group = self._group(src, self.rank)
        buf = torch.empty(HEADER_LEN, dtype=torch.int64, device=self.device)
        work = dist.irecv(buf, group_src=src, tag=_HEADER_TAG, group=group)
        assert work is not None  # None only for a rank outside the group; ours span all
        wait_for(work, self.timeout, self.rank, f"receiving a header from rank {src}")
        dtype, shape, key = self._decode(buf, src, None)
        with self._news:
            if key not in self._owed[src]:
                raise RuntimeError(f"rank {self.rank}: rank {src} sent {key}, which the plan "
                                   "does not have it send here (or sent it twice)")  # fmt: skip
            self._owed[src].remove(key)
        payload = torch.empty(shape, dtype=dtype, device=self.device)
        got = dist.irecv(payload, group_src=src, tag=self._payload_tag(key), group=group)
        assert got is not None
        wait_for(got, self.timeout, self.rank, f"receiving {key} from rank {src}")
        return key, payload

    def _check(self) -> None:
        if self._errors:
            raise self._errors[0]

    def poll(self) -> bool:
        """True if a tensor arrived since the last poll (never blocks)."""
        with self._news:
            self._check()
            news, self._seen = self._count > self._seen, self._count
        return news

    def wait(self) -> None:
        """Sleep until a new tensor arrives; TimeoutError after ``timeout_s`` naming what
        was still owed (ordered: :meth:`has` is True for all that can come; RuntimeError)."""
        if self.ordered:
            raise RuntimeError(f"rank {self.rank}: static order waits for a message no rank "
                               f"owes it; owed (by source): {self._owed}")  # fmt: skip
        with self._news:
            came = self._news.wait_for(
                lambda: self._count > self._seen or bool(self._errors),
                timeout=self.timeout.total_seconds(),
            )
            self._check()
            if not came:
                owed = {src: list(map(str, keys)) for src, keys in self._owed.items() if keys}
                raise TimeoutError(
                    f"rank {self.rank}: nothing arrived within {self.timeout.total_seconds():.0f}"
                    f"s; still owed (by source) {owed}"
                )

    def has(self, key: MessageKey, src: int) -> bool:
        """Whether the tensor for ``key`` from ``src`` is here (arrived, or handed over);
        ordered: or on its way (``src`` still owes it: :meth:`receive` waits for it)."""
        if src == self.rank:
            return key in self._local
        if self.ordered:
            return key in self._arrived or key in self._owed.get(src, ())
        with self._news:
            return key in self._arrived

    def receive(self, key: MessageKey, src: int) -> torch.Tensor:
        """Take the tensor for ``key``, which :meth:`has` says is here (ordered: waits for
        ``src``'s messages up to ``key``)."""
        if src == self.rank:
            return self._local.pop(key)
        if self.ordered:
            while key not in self._arrived and src in self._posted:
                self._take_posted(src)
        with self._news:
            if key not in self._arrived:
                raise RuntimeError(f"rank {self.rank}: {key} from rank {src} has not arrived")
            return self._arrived.pop(key)

    def send(self, key: MessageKey, dst: int, tensor: torch.Tensor) -> None:
        """Post the header (unless the shape is cached) and the payload (in memory when
        ``dst`` is this rank)."""
        if dst == self.rank:
            self._local[key] = tensor
            return
        if tensor.dtype not in DTYPES or tensor.dim() > MAX_DIMS:
            raise ValueError(
                f"{key} is a {tensor.dtype} tensor of {tensor.dim()} dims; a boundary tensor "
                f"needs one of {[str(d).removeprefix('torch.') for d in DTYPES]} and at most "
                f"{MAX_DIMS} dims"
            )
        tensor = tensor.detach().contiguous()
        group = self._group(self.rank, dst)
        sent: list[torch.Tensor] = []
        if self.shapes is not None and key in self.shapes.sent:
            self._check_static(key, tensor)
        else:
            if self.shapes is not None:
                self.shapes.sent[key] = (tensor.dtype, tensor.shape)
            header = torch.zeros(HEADER_LEN, dtype=torch.int64)
            header[:5] = torch.tensor([_KINDS.index(key.kind), key.stage, key.microbatch,
                                       DTYPES.index(tensor.dtype), tensor.dim()])  # fmt: skip
            header[5 : 5 + tensor.dim()] = torch.tensor(tensor.shape, dtype=torch.int64)
            sent.append(header.to(self.device))
        sent.append(tensor)
        tags = [_HEADER_TAG, self._payload_tag(key)][-len(sent) :]
        works = [dist.isend(t, group_dst=dst, tag=tag, group=group)
                 for t, tag in zip(sent, tags, strict=True)]  # fmt: skip
        assert all(w is not None for w in works)
        self._sends.append((key, sent, [w for w in works if w is not None]))

    def _check_static(self, key: MessageKey, tensor: torch.Tensor) -> None:
        dtype, shape = self.shapes.sent[key] if self.shapes is not None else (None, None)
        if (tensor.dtype, tensor.shape) != (dtype, shape):
            raise ValueError(
                f"static_shapes: {key.kind} of stage {key.stage} microbatch {key.microbatch} "
                f"is {tensor.dtype} {tuple(tensor.shape)}, but was {dtype} {tuple(shape or ())} "
                "in the first step; use PipelineRunner(static_shapes=False) for shapes that change"
            )

    def finish(self) -> None:
        """Wait for every posted send; check that everything owed came and was taken."""
        for key, _, works in self._sends:
            for work in works:
                wait_for(work, self.timeout, self.rank, f"sending {key}")
        self._sends.clear()
        for t in self._threads:
            t.join(self.timeout.total_seconds())
        self._check()
        left = [str(k) for keys in self._owed.values() for k in keys]
        left += [str(k) for k in (*self._arrived, *self._local)]
        if left:
            raise RuntimeError(f"rank {self.rank}: step ended with unconsumed messages {left}")
