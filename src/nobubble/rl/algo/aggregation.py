"""Gradient aggregation across learner workers, in-process and over torch.distributed.

There are four common ways to combine the gradients of W learner workers:

- **synchronous mean**: wait for all W gradients and average them. With equal per-worker
  batches (or losses normalised by the global token count and *summed*), this is exactly one
  learner on the combined batch.
- **asynchronous apply**: apply each gradient as soon as it arrives (:class:`ParameterServer`
  in-process, :func:`run_async_parameter_server` across ranks); it was computed on
  parameters ``staleness`` versions old.
- **local SGD**: each worker takes H local optimizer steps, then parameters are averaged
  (:class:`LocalSGD`); H = 1 with plain SGD is the synchronous mean.
- **staleness-weighted**: scale each gradient by ``w = 1 / (1 + staleness)``.

In-process functions take ``worker_grads``: a sequence over workers of sequences over
parameters (aligned, same shapes). Distributed functions take a :class:`DistContext`, use its
group and device, and wait at most ``ctx.timeout_s`` for each collective.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Literal, cast

import torch
import torch.distributed as dist

from nobubble.distributed import DistContext
from nobubble.rl.algo.staleness import StalenessKind, staleness_weight

__all__ = [
    "AggregationMode",
    "AggregatedGradients",
    "PushResult",
    "mean_gradients",
    "sum_gradients",
    "staleness_weighted_gradients",
    "average_parameters_",
    "all_reduce_gradients",
    "all_reduce_parameters",
    "LocalSGD",
    "ParameterServer",
    "AsyncApplyResult",
    "run_async_parameter_server",
]

AggregationMode = Literal["sync-mean", "async", "local-sgd", "staleness-weighted"]


@dataclass(frozen=True)
class AggregatedGradients:
    """Combined gradients and the weight each worker received (weights sum to 1)."""

    grads: list[torch.Tensor]
    weights: torch.Tensor


def _check_aligned(worker_grads: Sequence[Sequence[torch.Tensor]], who: str) -> None:
    if not worker_grads:
        raise ValueError(f"{who}: no worker gradients; pass one list of tensors per worker")
    shapes = [tuple(g.shape) for g in worker_grads[0]]
    for w, grads in enumerate(worker_grads):
        if [tuple(g.shape) for g in grads] != shapes:
            raise ValueError(
                f"{who}: worker {w} has gradient shapes {[tuple(g.shape) for g in grads]}, "
                f"worker 0 has {shapes}; all workers must hold the same parameters"
            )


def mean_gradients(
    worker_grads: Sequence[Sequence[torch.Tensor]], weights: Sequence[float] | None = None
) -> AggregatedGradients:
    """Synchronous (weighted) mean: ``sum_i w_i g_i / sum_i w_i`` per parameter."""
    _check_aligned(worker_grads, "mean_gradients")
    w = torch.ones(len(worker_grads), dtype=torch.float64)
    if weights is not None:
        w = torch.as_tensor(weights, dtype=torch.float64)
        if w.shape != (len(worker_grads),) or (w < 0).any() or w.sum() <= 0:
            raise ValueError(
                f"mean_gradients: weights={list(weights)} must be {len(worker_grads)} "
                "non-negative numbers, not all 0"
            )
    w = w / w.sum()
    grads = [
        _tensor_sum(float(wi) * g[p] for wi, g in zip(w, worker_grads))
        for p in range(len(worker_grads[0]))
    ]
    return AggregatedGradients(grads=grads, weights=w)


def _tensor_sum(terms: Iterable[torch.Tensor]) -> torch.Tensor:
    """``sum(terms)`` (``0 + t0 + t1 + ...``): a tensor, as ``terms`` is never empty here."""
    return cast(torch.Tensor, sum(terms))


def sum_gradients(worker_grads: Sequence[Sequence[torch.Tensor]]) -> list[torch.Tensor]:
    """Sum over workers: the right reduction when each worker's loss is already divided by the
    *global* token (or sequence) count, e.g. ``ppo_policy_loss(..., global_num_tokens=N)``."""
    _check_aligned(worker_grads, "sum_gradients")
    return [_tensor_sum(g[p] for g in worker_grads) for p in range(len(worker_grads[0]))]


def staleness_weighted_gradients(
    worker_grads: Sequence[Sequence[torch.Tensor]],
    staleness: Sequence[int],
    kind: StalenessKind = "inverse",
) -> AggregatedGradients:
    """Mean weighted by ``staleness_weight(s_i, kind)``, normalised to sum to 1.

    E.g. staleness ``[0, 1, 3]`` with ``"inverse"`` gives raw weights ``[1, 1/2, 1/4]``,
    normalised ``[4/7, 2/7, 1/7]``.
    """
    if len(staleness) != len(worker_grads):
        raise ValueError(
            f"staleness_weighted_gradients: {len(staleness)} staleness values for "
            f"{len(worker_grads)} workers"
        )
    return mean_gradients(worker_grads, [staleness_weight(s, kind) for s in staleness])


def average_parameters_(worker_params: Sequence[Sequence[torch.Tensor]]) -> None:
    """Set every worker's parameters to the mean over workers, in place (local SGD sync)."""
    _check_aligned(worker_params, "average_parameters_")
    with torch.no_grad():
        for p in range(len(worker_params[0])):
            mean = torch.stack([w[p] for w in worker_params]).mean(dim=0)
            for w in worker_params:
                w[p].copy_(mean)


def _wait(work: dist.Work | None, ctx: DistContext, what: str) -> None:
    # torch returns None instead of a Work only on a rank outside the group
    assert work is not None, f"{what}: rank {ctx.rank} is not in the process group"
    if not work.wait(timeout=timedelta(seconds=ctx.timeout_s)):
        raise TimeoutError(f"{what} did not finish within {ctx.timeout_s}s on rank {ctx.rank}")


def _flat_all_reduce(tensors: list[torch.Tensor], ctx: DistContext, what: str) -> torch.Tensor:
    """All-reduce (SUM) the concatenation of ``tensors`` in one collective; return the sum."""
    flat = torch.cat([t.reshape(-1) for t in tensors]).to(ctx.device)  # (sum of numels,)
    _wait(dist.all_reduce(flat, group=ctx.group, async_op=True), ctx, what)
    return flat


def _scatter_flat(flat: torch.Tensor, targets: list[torch.Tensor]) -> None:
    offset = 0
    for t in targets:
        n = t.numel()
        t.copy_(flat[offset : offset + n].view_as(t))  # (numel,) -> t.shape
        offset += n


def all_reduce_gradients(
    params: Iterable[torch.nn.Parameter],
    ctx: DistContext,
    *,
    op: Literal["mean", "sum"] = "mean",
    weight: float | None = None,
) -> float:
    """Replace each ``p.grad`` by its mean (or sum) over ranks, in one flat all-reduce.

    Args:
        params: parameters whose ``.grad`` is set (a missing grad counts as zeros).
        ctx: process-group context.
        op: ``"mean"``: ``sum_r w_r g_r / sum_r w_r`` (``w_r = weight`` or 1);
            ``"sum"``: ``sum_r g_r`` (losses normalised by a global count).
        weight: this rank's weight for ``"mean"``, e.g. ``staleness_weight(lag)``; >= 0.
    Returns:
        The normalised weight this rank's gradient received (1/W for a plain mean).
    """
    if op not in ("mean", "sum"):
        raise ValueError(f"all_reduce_gradients: op={op!r}; use 'mean' or 'sum'")
    if weight is not None and (op != "mean" or weight < 0):
        raise ValueError(f"all_reduce_gradients: weight={weight} needs op='mean' and weight >= 0")
    params = [p for p in params if p.requires_grad]
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    w = 1.0 if weight is None else float(weight)
    scale = w if op == "mean" else 1.0
    tensors = [_grad(p) * scale for p in params]
    if op == "mean":
        like = (
            _grad(params[0]) if params else torch.empty(0, dtype=torch.float64, device=ctx.device)
        )
        tensors.append(torch.tensor([w], dtype=like.dtype, device=like.device))
    flat = _flat_all_reduce(tensors, ctx, "all_reduce_gradients")
    if op == "mean":
        total_w = float(flat[-1])
        if total_w <= 0:
            raise ValueError("all_reduce_gradients: every rank passed weight 0; nothing to average")
        flat = flat[:-1] / total_w
        _scatter_flat(flat, [_grad(p) for p in params])
        return w / total_w
    _scatter_flat(flat, [_grad(p) for p in params])
    return 1.0


def _grad(p: torch.Tensor) -> torch.Tensor:
    assert p.grad is not None  # all_reduce_gradients zero-fills missing grads first
    return p.grad


def all_reduce_parameters(params: Iterable[torch.Tensor], ctx: DistContext) -> None:
    """Set parameters to their mean over ranks (local SGD's periodic averaging)."""
    params = list(params)
    with torch.no_grad():
        flat = _flat_all_reduce([p.detach() for p in params], ctx, "all_reduce_parameters")
        _scatter_flat(flat / ctx.world_size, params)


class LocalSGD:
    """Average parameters across ranks every ``sync_every`` (H) optimizer steps.

    Call :meth:`after_step` after each local ``optimizer.step()``; it returns True when it
    averaged. With ``ctx=None`` it works on ``worker_params`` in-process instead.
    """

    def __init__(
        self,
        params: Iterable[torch.Tensor] | None = None,
        *,
        sync_every: int,
        ctx: DistContext | None = None,
        worker_params: Sequence[Sequence[torch.Tensor]] | None = None,
    ) -> None:
        if sync_every < 1:
            raise ValueError(f"LocalSGD: sync_every={sync_every} must be >= 1 (1 = synchronous)")
        if (ctx is None) == (worker_params is None):
            raise ValueError(
                "LocalSGD: pass either ctx (distributed) or worker_params (in-process)"
            )
        if ctx is not None and params is None:
            raise ValueError("LocalSGD: distributed mode needs this rank's params")
        self.sync_every = sync_every
        self._params = list(params) if params is not None else []
        self._ctx = ctx
        self._worker_params = worker_params
        self.num_local_steps = 0

    def after_step(self) -> bool:
        self.num_local_steps += 1
        if self.num_local_steps % self.sync_every:
            return False
        if self._ctx is not None:
            all_reduce_parameters(self._params, self._ctx)
        else:
            assert self._worker_params is not None  # __init__: ctx or worker_params
            average_parameters_(self._worker_params)
        return True


@dataclass(frozen=True)
class PushResult:
    """What the server did with a pushed gradient."""

    applied: bool
    staleness: int
    weight: float
    version: int


class ParameterServer:
    """Asynchronous apply: gradients are applied in arrival order, weighted by staleness.

    ``pull`` returns a copy of the parameters and their ``version``; a worker computes a
    gradient on that copy and ``push``-es it with the version it started from. The server
    applies ``weight * grad`` with its optimizer, where ``weight = staleness_weight(version_now
    - base_version, kind)``, and drops gradients older than ``max_staleness``. Thread-safe.

    Args:
        params: initial parameters (copied).
        optimizer_factory: builds the optimizer over the server's parameters
            (default: plain SGD with ``lr``).
        lr: learning rate for the default optimizer.
        staleness_kind: ``"none"`` applies stale gradients at full weight.
        max_staleness: drop gradients with staleness above this (None = keep all).
    """

    def __init__(
        self,
        params: Iterable[torch.Tensor],
        *,
        optimizer_factory: Callable[[list[torch.Tensor]], torch.optim.Optimizer] | None = None,
        lr: float = 0.1,
        staleness_kind: StalenessKind = "inverse",
        max_staleness: int | None = None,
    ) -> None:
        if max_staleness is not None and max_staleness < 0:
            raise ValueError(f"ParameterServer: max_staleness={max_staleness} must be >= 0")
        staleness_weight(0, staleness_kind)  # validates the kind
        self.params = [p.detach().clone().requires_grad_(True) for p in params]
        factory = optimizer_factory or (lambda ps: torch.optim.SGD(ps, lr=lr))
        self._optimizer = factory(self.params)
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


@dataclass(frozen=True)
class AsyncApplyResult:
    """Outcome of :func:`run_async_parameter_server` on one rank.

    Attributes:
        pushes: rank 0: every push in the order the server applied it; workers: empty.
        workers: rank 0: the worker rank of each push.
        base_versions: rank 0: the version each push was computed on; workers: theirs.
        params: rank 0: the final parameters; workers: empty.
    """

    pushes: list[PushResult]
    workers: list[int]
    base_versions: list[int]
    params: list[torch.Tensor]


_TAG_HEADER, _TAG_PAYLOAD = 11, 12


def _send(tensors: list[torch.Tensor], dst: int, ctx: DistContext, what: str) -> None:
    works = [
        dist.isend(t, dst, group=ctx.group, tag=tag)
        for t, tag in zip(tensors, (_TAG_HEADER, _TAG_PAYLOAD))
    ]
    for w in works:
        _wait(w, ctx, what)


def _recv_payload(like: torch.Tensor, src: int, ctx: DistContext, what: str) -> torch.Tensor:
    buf = torch.empty_like(like)
    _wait(dist.irecv(buf, src, group=ctx.group, tag=_TAG_PAYLOAD), ctx, what)
    return buf


def run_async_parameter_server(
    ctx: DistContext,
    params: Sequence[torch.Tensor],
    compute_grad: Callable[[list[torch.Tensor], int, int], Sequence[torch.Tensor]],
    *,
    num_pushes: int,
    lr: float = 0.1,
    staleness_kind: StalenessKind = "inverse",
    max_staleness: int | None = None,
) -> AsyncApplyResult:
    """Asynchronous apply over torch.distributed: rank 0 serves, ranks 1.. compute gradients.

    Each worker ``num_pushes`` times: receives ``(version, parameters)``, calls
    ``compute_grad(params, worker_rank, step)``, sends ``(version, gradient)`` back. The server
    applies gradients in arrival order through a :class:`ParameterServer` (staleness weights,
    ``max_staleness`` drops) and answers that worker with the newest parameters. The server
    receives from each worker in its own thread (no any-source receive) and every wait is
    bounded by ``ctx.timeout_s``. Tested on gloo; NCCL needs a build that allows
    point-to-point calls from several threads.

    Args:
        ctx: process-group context, ``world_size >= 2``.
        params: initial parameters (rank 0's copy is used).
        compute_grad: run on each worker; returns gradients shaped like ``params``.
        num_pushes: gradients per worker, >= 1.
    Returns:
        :class:`AsyncApplyResult` (rank 0 holds the log and the final parameters).
    """
    if ctx.world_size < 2:
        raise ValueError(f"run_async_parameter_server: world_size={ctx.world_size}; need >= 2")
    if num_pushes < 1:
        raise ValueError(f"run_async_parameter_server: num_pushes={num_pushes} must be >= 1")
    params = [p.detach().to(ctx.device) for p in params]
    if ctx.rank != 0:
        return _async_worker(ctx, params, compute_grad, num_pushes)
    server = ParameterServer(
        params, lr=lr, staleness_kind=staleness_kind, max_staleness=max_staleness
    )
    return _async_server(ctx, server, num_pushes)


def _flat(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    return torch.cat([t.detach().reshape(-1) for t in tensors])  # (sum of numels,)


def _unflat(flat: torch.Tensor, like: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    out, offset = [], 0
    for t in like:
        out.append(flat[offset : offset + t.numel()].view_as(t))  # (numel,) -> t.shape
        offset += t.numel()
    return out


def _async_worker(
    ctx: DistContext,
    params: list[torch.Tensor],
    compute_grad: Callable[[list[torch.Tensor], int, int], Sequence[torch.Tensor]],
    num_pushes: int,
) -> AsyncApplyResult:
    header = torch.zeros(1, dtype=torch.int64, device=ctx.device)
    flat_like = _flat(params)
    versions = []
    for step in range(num_pushes):
        _wait(dist.irecv(header, 0, group=ctx.group, tag=_TAG_HEADER), ctx, "receiving params")
        current = _unflat(_recv_payload(flat_like, 0, ctx, "receiving params"), params)
        versions.append(int(header.item()))
        grads = compute_grad(current, ctx.rank, step)
        _send([header.clone(), _flat(grads).to(flat_like.dtype)], 0, ctx, "sending a gradient")
    return AsyncApplyResult(pushes=[], workers=[], base_versions=versions, params=[])


def _receive_loop(
    ctx: DistContext, worker: int, num_pushes: int, flat_like: torch.Tensor, inbox: queue.Queue
) -> None:
    """Thread body: receive ``num_pushes`` (version, gradient) messages from ``worker``."""
    try:
        for _ in range(num_pushes):
            header = torch.zeros(1, dtype=torch.int64, device=ctx.device)
            what = f"receiving a gradient from rank {worker}"
            _wait(dist.irecv(header, worker, group=ctx.group, tag=_TAG_HEADER), ctx, what)
            inbox.put((worker, int(header.item()), _recv_payload(flat_like, worker, ctx, what)))
    except BaseException as err:  # noqa: BLE001 - handed to the server loop, which raises it
        inbox.put((worker, -1, err))


def _async_server(ctx: DistContext, server: ParameterServer, num_pushes: int) -> AsyncApplyResult:
    def publish(worker: int) -> None:
        version, current = server.pull()
        header = torch.tensor([version], dtype=torch.int64, device=ctx.device)
        _send([header, _flat(current)], worker, ctx, f"sending params to rank {worker}")

    # One receiving thread per worker turns point-to-point receives into an arrival-ordered
    # inbox; gloo's pending receives only complete inside wait(), so they cannot be polled.
    workers = list(range(1, ctx.world_size))
    flat_like = _flat(server.params)
    inbox: queue.Queue = queue.Queue()
    threads = [
        threading.Thread(
            target=_receive_loop, args=(ctx, w, num_pushes, flat_like, inbox), daemon=True
        )
        for w in workers
    ]
    for w, t in zip(workers, threads):
        publish(w)
        t.start()
    remaining = dict.fromkeys(workers, num_pushes)
    log = AsyncApplyResult(pushes=[], workers=[], base_versions=[], params=[])
    for _ in range(len(workers) * num_pushes):
        try:
            w, base_version, grad = inbox.get(timeout=ctx.timeout_s)
        except queue.Empty:
            raise TimeoutError(
                f"parameter server: no gradient from ranks "
                f"{[w for w, n in remaining.items() if n]} within {ctx.timeout_s}s"
            ) from None
        if isinstance(grad, BaseException):
            raise RuntimeError(f"parameter server: receiving from rank {w} failed") from grad
        log.pushes.append(server.push(_unflat(grad, server.params), base_version))
        log.workers.append(w)
        log.base_versions.append(base_version)
        remaining[w] -= 1
        if remaining[w]:
            publish(w)
    for t in threads:
        t.join(timeout=ctx.timeout_s)
    log.params.extend(p.detach().clone() for p in server.params)
    return log
