"""Gradient aggregation over torch.distributed (``RunConfig.aggregation``): a weighted mean, an
async :class:`ParameterServer` fed by versioned point-to-point messages (tested on gloo; NCCL
needs point-to-point from several threads), :class:`LocalSGD`; each wait bounded by
``ctx.timeout_s``."""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Literal

import torch
import torch.distributed as dist

from nobubble.distributed import DistContext
from nobubble.rl.algo.staleness import StalenessKind, staleness_weight

__all__ = [
    "filled_grads",
    "all_reduce_gradients",
    "broadcast_parameters",
    "LocalSGD",
    "ParameterServer",
    "PushResult",
    "send_versioned",
    "recv_versioned",
    "VersionedInbox",
]


def _wait(work: dist.Work | None, ctx: DistContext, what: str) -> None:
    # torch returns None instead of a Work only on a rank outside the group
    assert work is not None, f"{what}: rank {ctx.rank} is not in the process group"
    if not work.wait(timeout=timedelta(seconds=ctx.timeout_s)):
        raise TimeoutError(f"{what} did not finish within {ctx.timeout_s}s on rank {ctx.rank}")


def _flat(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    return torch.cat([t.detach().reshape(-1) for t in tensors])  # (sum of numels,)


def _unflat(flat: torch.Tensor, like: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    parts = flat.split([t.numel() for t in like])
    return [part.view_as(t) for part, t in zip(parts, like)]  # (numel,) -> t.shape


def _flat_all_reduce(tensors: list[torch.Tensor], ctx: DistContext, what: str) -> torch.Tensor:
    """All-reduce (SUM) the concatenation of ``tensors`` in one collective; return the sum."""
    flat = _flat(tensors).to(ctx.device)  # (sum of numels,)
    _wait(dist.all_reduce(flat, group=ctx.group, async_op=True), ctx, what)
    return flat


def _scatter_flat(flat: torch.Tensor, targets: list[torch.Tensor]) -> None:
    for t, part in zip(targets, _unflat(flat, targets)):
        t.copy_(part)


def filled_grads(params: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """Each parameter's ``.grad``, set to zeros first where it has none (a head the loss did
    not use contributes a zero gradient)."""
    grads = []
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        grads.append(p.grad)
    return grads


def all_reduce_gradients(
    params: Iterable[torch.nn.Parameter],
    ctx: DistContext,
    *,
    op: Literal["mean", "sum"] = "mean",
    weight: float | None = None,
) -> float:
    """Replace each ``p.grad`` (a missing one counts as zeros) in one flat all-reduce by
    ``sum_r w_r g_r / sum_r w_r`` (``op="mean"``; ``w_r``: rank r's ``weight >= 0``, e.g.
    ``staleness_weight(lag)``, default 1) or ``sum_r g_r`` (``"sum"``: losses normalised by a
    global count). Returns this rank's normalised weight (1/W for a plain mean)."""
    if op not in ("mean", "sum"):
        raise ValueError(f"all_reduce_gradients: op={op!r}; use 'mean' or 'sum'")
    if weight is not None and (op != "mean" or weight < 0):
        raise ValueError(f"all_reduce_gradients: weight={weight} needs op='mean' and weight >= 0")
    grads = filled_grads([p for p in params if p.requires_grad])
    w = 1.0 if weight is None else float(weight)
    like = grads[0] if grads else torch.empty(0, dtype=torch.float64, device=ctx.device)
    weight_1 = torch.tensor([w], dtype=like.dtype, device=like.device)  # (1,), summed too
    flat = _flat_all_reduce([*(g * w for g in grads), weight_1], ctx, "all_reduce_gradients")
    total_w = float(flat[-1]) if op == "mean" else 1.0  # "sum": w = 1, nothing to divide
    if total_w <= 0:
        raise ValueError("all_reduce_gradients: every rank passed weight 0; nothing to average")
    _scatter_flat(flat[:-1] / total_w, grads)
    return w / total_w


def broadcast_parameters(params: Sequence[torch.Tensor], ctx: DistContext, src: int = 0) -> None:
    """Set parameters to rank ``src``'s, in place (one flat broadcast): a common start."""
    with torch.no_grad():
        flat = _flat(params).to(ctx.device)  # (sum of numels,)
        _wait(dist.broadcast(flat, src, group=ctx.group, async_op=True), ctx, "broadcast")
        _scatter_flat(flat, list(params))


class LocalSGD:
    """Average parameters across ranks every ``sync_every`` (H) optimizer steps: call
    :meth:`after_step` after each local ``optimizer.step()``; True when it averaged."""

    def __init__(self, params: Iterable[torch.Tensor], *, sync_every: int, ctx: DistContext):
        if sync_every < 1:
            raise ValueError(f"LocalSGD: sync_every={sync_every} must be >= 1 (1 = synchronous)")
        self.sync_every = sync_every
        self._params = list(params)
        self._ctx = ctx
        self.num_local_steps = 0

    def after_step(self) -> bool:
        self.num_local_steps += 1
        if self.num_local_steps % self.sync_every:
            return False
        with torch.no_grad():  # every parameter set to its mean over the ranks
            flat = _flat_all_reduce(self._params, self._ctx, "LocalSGD parameter averaging")
            _scatter_flat(flat / self._ctx.world_size, self._params)
        return True


@dataclass(frozen=True)
class PushResult:
    """What the server did with a pushed gradient."""

    applied: bool
    staleness: int
    weight: float
    version: int


class ParameterServer:
    """Asynchronous apply: ``push(grad, base_version)`` applies ``staleness_weight(version -
    base_version, staleness_kind) * grad`` with ``optimizer`` (default: SGD with ``lr``) in
    arrival order, one new version each, dropping gradients staler than ``max_staleness``
    (None: none); ``pull`` returns ``(version, parameter copies)``. Both hold one lock;
    ``params`` are trained in place: don't change them while another thread pushes."""

    def __init__(
        self,
        params: Iterable[torch.Tensor],
        *,
        optimizer: torch.optim.Optimizer | None = None,
        lr: float = 0.1,
        staleness_kind: StalenessKind = "inverse",
        max_staleness: int | None = None,
    ) -> None:
        if max_staleness is not None and max_staleness < 0:
            raise ValueError(f"ParameterServer: max_staleness={max_staleness} must be >= 0")
        staleness_weight(0, staleness_kind)  # validates the kind
        self.params = list(params)
        self._optimizer = optimizer or torch.optim.SGD(self.params, lr=lr)
        self.staleness_kind = staleness_kind
        self.max_staleness = max_staleness
        self.version = 0
        self._lock = threading.Lock()

    def pull(self) -> tuple[int, list[torch.Tensor]]:
        """``(version, detached copies of the parameters)``."""
        with self._lock:
            return self.version, [p.detach().clone() for p in self.params]

    def push(self, grads: Sequence[torch.Tensor], base_version: int) -> PushResult:
        """Apply a gradient computed on parameters of ``base_version``."""
        with self._lock:
            staleness = self.version - base_version
            if staleness < 0:
                raise ValueError(
                    f"ParameterServer.push: base_version={base_version} is newer than the "
                    f"server's version {self.version}"
                )
            if self.max_staleness is not None and staleness > self.max_staleness:
                return PushResult(False, staleness, 0.0, self.version)
            weight = float(staleness_weight(staleness, self.staleness_kind))
            for p, g in zip(self.params, grads, strict=True):
                p.grad = (weight * g).to(p.dtype)
            self._optimizer.step()
            self._optimizer.zero_grad(set_to_none=True)
            self.version += 1
            return PushResult(True, staleness, weight, self.version)


_TAG_VERSION, _TAG_TENSORS = 11, 12


def send_versioned(
    ctx: DistContext, tensors: Sequence[torch.Tensor], version: int, dst: int
) -> None:
    """Send ``version`` and ``tensors`` (one flat message; e.g. a gradient and the version of its
    parameters) to rank ``dst``, whose ``like`` must match them in shapes and dtype."""
    header = torch.tensor([version], dtype=torch.int64, device=ctx.device)
    works = [
        dist.isend(header, dst, group=ctx.group, tag=_TAG_VERSION),
        dist.isend(_flat(tensors).to(ctx.device), dst, group=ctx.group, tag=_TAG_TENSORS),
    ]
    for work in works:
        _wait(work, ctx, f"sending to rank {dst}")


def recv_versioned(
    ctx: DistContext, like: Sequence[torch.Tensor], src: int
) -> tuple[int, list[torch.Tensor]]:
    """``(version, tensors shaped like like)`` that :func:`send_versioned` sent from ``src``."""
    what = f"receiving from rank {src}"
    header = torch.zeros(1, dtype=torch.int64, device=ctx.device)
    _wait(dist.irecv(header, src, group=ctx.group, tag=_TAG_VERSION), ctx, what)
    flat = torch.empty_like(_flat(like), device=ctx.device)  # (sum of numels,)
    _wait(dist.irecv(flat, src, group=ctx.group, tag=_TAG_TENSORS), ctx, what)
    return int(header.item()), _unflat(flat, like)


class VersionedInbox:
    """Versioned messages from the ranks ``sources`` in arrival order, ``per_source`` each, by
    one receiving thread per source (gloo's receives complete only inside ``wait()``: no
    polling), started at construction; :meth:`get` (waiting) and :meth:`arrived` (not) return
    each message once, raising a failed receive with its rank; :meth:`close` joins them."""

    def __init__(
        self,
        ctx: DistContext,
        like: Sequence[torch.Tensor],
        sources: Iterable[int],
        per_source: int = 1,
    ) -> None:
        self.ctx = ctx
        self._inbox: queue.Queue = queue.Queue()
        self._owing = dict.fromkeys(sources, per_source)
        self._threads = [
            threading.Thread(target=self._receive, args=(like, src, per_source), daemon=True)
            for src in self._owing
        ]
        for thread in self._threads:
            thread.start()

    def _receive(self, like: Sequence[torch.Tensor], src: int, num: int) -> None:
        try:
            for _ in range(num):
                self._inbox.put((src, *recv_versioned(self.ctx, like, src)))
        except BaseException as err:  # noqa: BLE001 - handed to get(), which raises it
            self._inbox.put((src, -1, err))

    def get(self) -> tuple[int, int, list[torch.Tensor]]:
        """The next ``(source, version, tensors)``. Raises TimeoutError after ``ctx.timeout_s``
        without a message, naming the ranks that still owe one."""
        try:
            return self._take(self._inbox.get(timeout=self.ctx.timeout_s))
        except queue.Empty:
            owing = [r for r, n in self._owing.items() if n]
            raise TimeoutError(
                f"rank {self.ctx.rank}: no message from ranks {owing} within {self.ctx.timeout_s}s"
            ) from None

    def arrived(self) -> list[tuple[int, int, list[torch.Tensor]]]:
        """The messages that have arrived and were not taken yet, without waiting."""
        # only this thread takes from the queue: qsize() messages are surely there
        return [self._take(self._inbox.get_nowait()) for _ in range(self._inbox.qsize())]

    def _take(self, item: tuple[int, int, Any]) -> tuple[int, int, list[torch.Tensor]]:
        src, version, tensors = item
        if isinstance(tensors, BaseException):
            raise RuntimeError(f"rank {self.ctx.rank}: receiving from rank {src} failed") from (
                tensors
            )
        self._owing[src] -= 1
        return src, version, tensors

    def close(self) -> None:
        for thread in self._threads:
            thread.join(timeout=self.ctx.timeout_s)
