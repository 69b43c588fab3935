"""A local spawner that never hangs: :func:`spawn` runs ``fn(ctx, *args)`` on ``world_size``
local ranks under the one supervisor (:mod:`.supervisor`) and returns every rank's result.
Results and errors travel through one pipe per rank (a killed launcher leaves no named
semaphore behind); ranks ignore SIGINT (the launcher stops them) and turn SIGTERM into
``SystemExit`` so their ``finally`` blocks run.
"""

from __future__ import annotations

import io
import os
import pickle
import signal
import sys
import time
from collections.abc import Callable, Sequence
from datetime import timedelta
from multiprocessing.connection import wait
from typing import Any

from nobubble.distributed.context import DistContext, check_device, default_backend, worker_context
from nobubble.distributed.supervisor import (
    LIVENESS_S,
    Supervisor,
    Ward,
    WorkerError,
    reap,
    supervised,
)

__all__ = ["RankFailure", "spawn"]


class RankFailure(WorkerError):
    """A :class:`~nobubble.distributed.WorkerError` of a spawned rank: ``rank`` is its
    number (the worker is named ``"rank <n>"``), ``remote_traceback`` its report."""

    def __init__(self, rank: int | None, message: str, remote_traceback: str = "") -> None:
        super().__init__(message, None if rank is None else f"rank {rank}", remote_traceback)
        self.rank = rank

    @classmethod
    def of(cls, err: WorkerError) -> RankFailure:
        """The supervisor's failure of worker ``"rank <n>"`` as spawn's error."""
        rank = int(err.worker.split()[1]) if err.worker else None
        return cls(rank, str(err), err.remote_traceback)


def _worker(ward: Ward, settings: tuple, job: _Job, conn: Any) -> None:
    """One rank under the supervisor's guard (:func:`supervised`: heartbeat first, then torch
    and the job, so the launcher hears from the rank while torch imports - seconds on a
    loaded machine); its error goes to the launcher through its pipe."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the launcher, which stops us
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})  # blocked from the start
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    sys.unraisablehook = _exit_if_unraisable_exit
    rank = int(ward.name.split()[1])
    supervised(ward, lambda text: conn.send(("err", rank, text)), _run_rank, rank, settings,
               job, conn)  # fmt: skip


def _run_rank(rank: int, settings: tuple, job: _Job, conn: Any) -> None:
    """Join the group, run ``fn(ctx, *args)``, send the result (``torch.save`` bytes)."""
    world_size, port, backend, device, timeout_s, threads = settings
    try:
        import torch
        import torch.distributed as dist

        torch.set_num_threads(threads)
        fn, args = job.unpack()
        dev = torch.device(device)
        if dev.type == "cuda":
            dev = torch.device("cuda", rank % max(torch.cuda.device_count(), 1))
            torch.cuda.set_device(dev)
        # the launcher serves the rendezvous store on ``port`` (bound there, so no other run
        # can take the port between choosing and binding it); every rank is a client
        store = dist.TCPStore("127.0.0.1", port, None, False, timeout=timedelta(seconds=timeout_s))
        dist.init_process_group(
            backend,
            store=store,
            rank=rank,
            world_size=world_size,
            timeout=timedelta(seconds=timeout_s),
        )
        ctx = DistContext(rank, world_size, backend, dev, rank, world_size, timeout_s)
        out = fn(ctx, *args)
        buf = io.BytesIO()
        torch.save(out, buf)  # tensors and plain objects alike; no shared-memory handles
        conn.send(("ok", rank, buf.getvalue()))  # only this thread writes the pipe
    finally:  # leave the group if this rank got as far as creating it
        dist_module = sys.modules.get("torch.distributed")
        if dist_module is not None and dist_module.is_initialized():
            try:
                dist_module.destroy_process_group()
            except Exception:  # noqa: BLE001 - the group may be broken by a failed peer
                pass


class _Job:
    """``(fn, args)`` that crosses to a rank as bytes and is unpickled only when the rank
    asks (:meth:`unpack`), not while ``multiprocessing`` starts it. The bytes are made while
    the process starts (``__reduce__`` runs then), with multiprocessing's own pickler, so
    queues, pipes and shared tensors in ``args`` cross as they would as plain arguments."""

    def __init__(self, fn: Callable[..., Any] | None, args: tuple, blob: bytes = b"") -> None:
        self.fn, self.args, self.blob = fn, args, blob

    def __reduce__(self) -> tuple:
        from multiprocessing.reduction import ForkingPickler

        return (_Job, (None, (), bytes(ForkingPickler.dumps((self.fn, self.args)))))

    def unpack(self) -> tuple[Callable[..., Any], tuple]:
        return pickle.loads(self.blob)  # noqa: S301 - our own bytes, from the launcher


def _exit_on_sigterm(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)


def _exit_if_unraisable_exit(unraisable: Any) -> None:
    """A SIGTERM that lands in a callback Python cannot raise from (a weakref callback of
    the import lock, a ``__del__``) would be printed as "Exception ignored" with a traceback
    and lost; the rank exits with its code instead. Anything else: Python's own report."""
    if isinstance(unraisable.exc_value, SystemExit):
        os._exit(unraisable.exc_value.code if isinstance(unraisable.exc_value.code, int) else 1)
    sys.__unraisablehook__(unraisable)


def spawn(
    fn: Callable[..., Any],
    world_size: int,
    *,
    args: Sequence[Any] = (),
    backend: str | None = None,
    device: str = "cpu",
    timeout_s: float = 120.0,
    threads_per_rank: int = 1,
    liveness_s: float | None = LIVENESS_S,
) -> list[Any]:
    """Run ``fn(ctx, *args)`` on ``world_size`` local ranks and return their results by rank.

    Args:
        fn: a module-level (picklable) function; its return value must be picklable by
            ``torch.save`` (tensors are fine).
        world_size: number of processes, >= 1.
        args: extra positional arguments, picklable.
        backend: default ``gloo`` on CPU, ``nccl`` on CUDA.
        device: ``"cpu"`` or ``"cuda"`` (rank r uses ``cuda:r``).
        timeout_s: limit for the whole job and for every collective inside it.
        threads_per_rank: ``torch.set_num_threads`` in each rank.
        liveness_s: a rank that sends no heartbeat for this long (SIGSTOP, a deadlock holding
            the interpreter) is declared hung, by rank; None turns the watchdog off.
    Raises:
        RankFailure: a rank raised (its traceback is attached), died, stopped responding, or
            the job timed out.
    """
    if world_size < 1:
        raise ValueError(f"spawn: world_size={world_size} must be >= 1")
    if timeout_s <= 0:
        raise ValueError(f"spawn: timeout_s={timeout_s} must be > 0")
    import torch.distributed as dist

    check_device(device, backend, ranks=world_size)  # before any rank starts
    backend = backend or default_backend(device)
    ctx = worker_context()
    supervisor = Supervisor(ctx, [f"rank {r}" for r in range(world_size)], liveness_s)  # checks it
    job = _Job(fn, tuple(args))  # unpickled by the rank after its heartbeat starts
    # the ranks' rendezvous: a TCPStore this process serves on a port the kernel picks and
    # keeps bound until the ranks are reaped (a port found free, then bound, could be taken)
    store = dist.TCPStore("127.0.0.1", 0, None, True, timeout=timedelta(seconds=timeout_s),
                          wait_for_workers=False)  # fmt: skip
    settings = (world_size, store.port, backend, device, timeout_s, threads_per_rank)
    inbox = _Inbox(_start_ranks(ctx, settings, job, supervisor), supervisor)
    deadline = time.monotonic() + timeout_s
    ok = False
    try:
        while len(inbox.outputs) < world_size:
            failure = supervisor.failure(inbox.receive)
            if failure is not None:
                raise RankFailure.of(failure)
            if time.monotonic() > deadline:
                waiting = [r for r in range(world_size) if r not in inbox.outputs]
                raise RankFailure(
                    waiting[0] if waiting else None,
                    f"timed out after {timeout_s:g}s waiting for rank(s) {waiting}; "
                    "raise timeout_s if the job is just slow",
                )
            supervisor.hear(inbox.receive(0.2))
        ok = True
    finally:
        reap(list(supervisor.procs.values()), grace_s=5.0 if ok else 0.0)
        inbox.close()
    return [inbox.outputs[r] for r in range(world_size)]


def _start_ranks(ctx: Any, settings: tuple, job: _Job, supervisor: Supervisor) -> list[Any]:
    """Start one process per rank (in ``supervisor.procs``); returns the launcher's ends of
    their pipes."""
    world_size = settings[0]
    pipes = [ctx.Pipe(duplex=False) for _ in range(world_size)]  # (launcher end, rank end)
    for r in range(world_size):
        ward = supervisor.ward(f"rank {r}")
        supervisor.procs[ward.name] = ctx.Process(
            target=_worker, args=(ward, settings, job, pipes[r][1]), daemon=True
        )
    # SIGINT stays blocked from the exec until the rank ignores it: a Ctrl-C while the ranks
    # start up reaches the launcher only, not half-started ranks printing tracebacks
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        for p in supervisor.procs.values():
            p.start()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
    for _, rank_end in pipes:
        rank_end.close()  # the rank holds its own copy; EOF then means the rank is gone
    return [launcher_end for launcher_end, _ in pipes]


class _Inbox:
    """The launcher's ends of the ranks' pipes: results into :attr:`outputs` (the rank is
    then finished), errors returned for the supervisor."""

    def __init__(self, conns: list[Any], supervisor: Supervisor) -> None:
        self.conns, self.supervisor = conns, supervisor
        self.open = set(range(len(conns)))
        self.outputs: dict[int, Any] = {}

    def receive(self, timeout_s: float) -> dict[str, str]:
        """Take what arrived within ``timeout_s``; returns the errors by rank name."""
        import torch

        errors: dict[str, str] = {}
        ready = wait([self.conns[r] for r in self.open], timeout=timeout_s)
        for r in list(self.open):
            conn = self.conns[r]
            if conn not in ready:
                continue
            try:
                while conn.poll():
                    status, rank, payload = conn.recv()
                    if status == "err":
                        errors.setdefault(f"rank {rank}", payload)
                    else:
                        self.outputs[rank] = torch.load(io.BytesIO(payload), weights_only=False)
                        self.supervisor.finish(f"rank {rank}")
            except (EOFError, OSError):  # the rank exited; its exit code tells how
                self.open.discard(r)
        return errors

    def close(self) -> None:
        for conn in self.conns:
            conn.close()
