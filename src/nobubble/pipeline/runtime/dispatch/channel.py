"""Messages that name the tensor they carry, for receivers that cannot know the send order.

Under the handshake every rank picks its next op at run time, so the order in which a
neighbour sends is not known before the step (:class:`~..messages.ShapedChannel` relies on
it). Here the sender says what it sends: a message is a header ``int64 [5 + MAX_DIMS]``
(kind 0 act / 1 grad, receiving stage, microbatch, dtype code, number of dims, the dims),
sent with one tag for all headers of a direction, then the payload with the key's own tag.

Lifecycle of a message on the receiving side, per source rank:
``POSTED`` (the one header receive posted for that source) -> ``HEADER`` (key and shape
read; the payload's receive posted) -> ``ARRIVED`` (in the mailbox by key; the next header's
receive posted) -> ``TAKEN`` (:meth:`KeyedChannel.receive`). Invariant: while a source still
owes this rank messages (the plan says how many, not in which order), one receive is posted
for it, so every send finds its receive and nothing waits on the order. Receives from one
source are posted in the order it sends (header, payload, next header), so matching is the
same with tag-matching gloo and order-matching NCCL. Directions travel in two process
groups, as in :mod:`~..p2p`.

Gloo's point-to-point work reports completion only from ``wait()`` (``is_completed()``
stays False until then), so each source has a receiver thread that posts its receives and
blocks in ``wait`` (the GIL released), and files what came in the mailbox. The rank's own
thread never blocks while it has runnable work: :meth:`KeyedChannel.poll` only looks at the
mailbox; :meth:`KeyedChannel.wait` sleeps on it until something new comes, bounded by
``timeout_s``. A receiver's failure (a timeout, a dead peer) is raised in the rank's thread.
"""

from __future__ import annotations

import threading
from datetime import timedelta

import torch
import torch.distributed as dist

from nobubble.pipeline.actions import Schedule
from nobubble.pipeline.runtime.messages import DTYPES, MAX_DIMS
from nobubble.pipeline.runtime.p2p import MessageKey, expected_messages, wait_for

__all__ = ["KeyedChannel", "HEADER_LEN"]

HEADER_LEN = 5 + MAX_DIMS
_HEADER_TAG = 0  # every header of a direction; payloads use 1 + the key's tag
_KINDS = ("act", "grad")


class KeyedChannel:
    """One rank's sends and receives for one step, in whatever order the ranks choose.

    Args:
        schedule: the plan (it says which keys come from which source, not when).
        rank: this rank (within ``groups``).
        device: where received tensors are placed.
        timeout_s: limit for every wait.
        groups: two process groups over the pipeline's ranks, one per direction (to a
            higher rank, to a lower rank); None uses the default group for both.
    """

    def __init__(
        self,
        schedule: Schedule,
        rank: int,
        *,
        device: torch.device,
        timeout_s: float,
        groups: tuple[dist.ProcessGroup | None, dist.ProcessGroup | None] | None = None,
    ) -> None:
        self.schedule, self.rank, self.device = schedule, rank, device
        self.timeout = timedelta(seconds=timeout_s)
        self.groups = groups or (None, None)
        self._owed = {src: set(keys) for src, keys in expected_messages(schedule, rank).items()}
        self._arrived: dict[MessageKey, torch.Tensor] = {}  # ARRIVED (the mailbox)
        self._local: dict[MessageKey, torch.Tensor] = {}  # same-rank handovers
        self._sends: list[tuple[MessageKey, list[torch.Tensor], list[dist.Work]]] = []
        self._news = threading.Condition()  # guards _arrived, _owed, _count, _errors
        self._count = self._seen = 0  # tensors filed so far / when poll last looked
        self._errors: list[BaseException] = []
        self._threads = [
            threading.Thread(target=self._receive_from, args=(src, len(keys)), daemon=True,
                             name=f"rank{rank}-from{src}")
            for src, keys in self._owed.items()
        ]  # fmt: skip
        for t in self._threads:
            t.start()

    def _group(self, src: int, dst: int) -> dist.ProcessGroup | None:
        return self.groups[0] if src < dst else self.groups[1]

    def _payload_tag(self, key: MessageKey) -> int:
        return 1 + key.tag(self.schedule.num_stages, self.schedule.num_microbatches)

    def _receive_from(self, src: int, num_messages: int) -> None:
        """Receiver thread: ``num_messages`` (header, payload) pairs from ``src``, in the
        order ``src`` sends them, each filed in the mailbox as it comes."""
        group = self._group(src, self.rank)
        try:
            for _ in range(num_messages):
                buf = torch.empty(HEADER_LEN, dtype=torch.int64, device=self.device)
                work = dist.irecv(buf, group_src=src, tag=_HEADER_TAG, group=group)
                assert work is not None  # None only for a rank outside the group
                wait_for(work, self.timeout, self.rank, f"receiving a header from rank {src}")
                kind, stage, mb, code, ndim, *dims = buf.tolist()
                key = MessageKey(_KINDS[kind], stage, mb)
                with self._news:
                    if key not in self._owed[src]:
                        raise RuntimeError(f"rank {self.rank}: rank {src} sent {key}, which the "
                                           "plan does not have it send here (or sent it twice)")  # fmt: skip
                    self._owed[src].discard(key)
                payload = torch.empty(dims[:ndim], dtype=DTYPES[code], device=self.device)
                got = dist.irecv(payload, group_src=src, tag=self._payload_tag(key), group=group)
                assert got is not None
                wait_for(got, self.timeout, self.rank, f"receiving {key} from rank {src}")
                with self._news:
                    self._arrived[key] = payload
                    self._count += 1
                    self._news.notify_all()
        except BaseException as err:  # handed to the rank's thread, which raises it
            with self._news:
                self._errors.append(err)
                self._news.notify_all()

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
        was still owed."""
        with self._news:
            came = self._news.wait_for(
                lambda: self._count > self._seen or bool(self._errors),
                timeout=self.timeout.total_seconds(),
            )
            self._check()
            if not came:
                owed = {src: sorted(map(str, keys)) for src, keys in self._owed.items() if keys}
                raise TimeoutError(
                    f"rank {self.rank}: nothing arrived within {self.timeout.total_seconds():.0f}"
                    f"s; still owed (by source) {owed}"
                )

    def has(self, key: MessageKey, src: int) -> bool:
        """Whether the tensor for ``key`` from ``src`` is here (arrived, or handed over)."""
        if src == self.rank:
            return key in self._local
        with self._news:
            return key in self._arrived

    def receive(self, key: MessageKey, src: int) -> torch.Tensor:
        """Take the tensor for ``key``, which :meth:`has` says is here."""
        if src == self.rank:
            return self._local.pop(key)
        with self._news:
            if key not in self._arrived:
                raise RuntimeError(f"rank {self.rank}: {key} from rank {src} has not arrived")
            return self._arrived.pop(key)

    def send(self, key: MessageKey, dst: int, tensor: torch.Tensor) -> None:
        """Post the header (naming ``key``) and the payload (in memory when ``dst`` is us)."""
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
        header = torch.zeros(HEADER_LEN, dtype=torch.int64)
        header[:5] = torch.tensor([_KINDS.index(key.kind), key.stage, key.microbatch,
                                   DTYPES.index(tensor.dtype), tensor.dim()])  # fmt: skip
        header[5 : 5 + tensor.dim()] = torch.tensor(tensor.shape, dtype=torch.int64)
        header = header.to(self.device)
        group = self._group(self.rank, dst)
        works = [dist.isend(header, group_dst=dst, tag=_HEADER_TAG, group=group),
                 dist.isend(tensor, group_dst=dst, tag=self._payload_tag(key), group=group)]  # fmt: skip
        assert all(w is not None for w in works)
        self._sends.append((key, [header, tensor], [w for w in works if w is not None]))

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
