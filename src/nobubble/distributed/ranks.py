"""A local spawner that never hangs: :func:`spawn` starts ``world_size`` local processes, one
per rank, initialises a torch.distributed group in each (gloo on CPU by default; NCCL with
``device="cuda"``), calls ``fn(ctx, *args)`` and returns every rank's result.

A rank that raises makes ``spawn`` terminate the others and raise :class:`RankFailure`
carrying that rank's traceback; a rank that dies without a word, one whose heartbeat stops
(stopped, or wedged holding the interpreter) for ``liveness_s``, or a run past ``timeout_s``,
is reported the same way. Nothing waits forever. Results travel through one pipe per rank,
so a killed launcher leaves no named semaphore in ``/dev/shm`` behind; heartbeats are the
shared slots of :mod:`nobubble.distributed.liveness`, written from before torch is imported.
Ranks ignore SIGINT (the launcher stops them), turn SIGTERM into ``SystemExit`` so their
``finally`` blocks run, and die with the launcher (the parent-death signal).
"""

from __future__ import annotations

import io
import os
import pickle
import signal
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from datetime import timedelta
from multiprocessing.connection import wait
from typing import Any

from nobubble.distributed.context import DistContext, check_device, default_backend, worker_context
from nobubble.distributed.liveness import BEAT_S, LIVENESS_S, Heartbeats, reap, start_beating
from nobubble.lifetime import die_with_parent

__all__ = ["RankFailure", "spawn"]


class RankFailure(RuntimeError):
    """One rank of a spawned job failed; ``rank`` and ``remote_traceback`` say where and why."""

    def __init__(self, rank: int | None, message: str, remote_traceback: str = "") -> None:
        self.rank = rank
        self.remote_traceback = remote_traceback
        super().__init__(message)


def _worker(
    parent_pid: int,
    rank: int,
    world_size: int,
    port: int,
    backend: str,
    device: str,
    timeout_s: float,
    threads: int,
    job: _Job,
    conn: Any,
    beats: tuple[Any, int],
) -> None:
    """One rank: heartbeat first, then torch and the job (``(fn, args)``, unpickled here),
    so the launcher hears from the rank while torch imports (seconds on a loaded machine)."""
    die_with_parent(parent_pid)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the launcher, which stops us
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})  # blocked from the start
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    sys.unraisablehook = _exit_if_unraisable_exit
    start_beating(*beats)
    put = conn.send  # only this thread writes the pipe
    try:  # from here on every failure, an import's too, reaches the launcher with its traceback
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
        put(("ok", rank, buf.getvalue()))
    except BaseException as err:  # noqa: BLE001 - every failure must reach the parent
        try:
            put(("err", rank, f"{type(err).__name__}: {err}\n{traceback.format_exc()}"))
        except OSError:  # the launcher is gone: nobody to tell
            pass
    finally:
        _leave_group()


def _leave_group() -> None:
    """Destroy the default group if this rank got as far as creating it."""
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
    if liveness_s is not None and not liveness_s > 2 * BEAT_S:
        raise ValueError(f"spawn: liveness_s={liveness_s} must be > {2 * BEAT_S:g} (or None)")
    check_device(device, backend, ranks=world_size)  # before any rank starts
    backend = backend or default_backend(device)
    job = _Job(fn, tuple(args))  # unpickled by the rank after its heartbeat starts
    store = _rendezvous_store(timeout_s)  # held until the ranks are reaped
    ctx = worker_context()
    beats = Heartbeats(ctx, [f"rank {r}" for r in range(world_size)], liveness_s)
    settings = (world_size, store.port, backend, device, timeout_s, threads_per_rank, job)
    procs, pipes = _start_ranks(ctx, settings, beats)
    inbox = _Inbox(pipes)
    outputs: dict[int, Any] = {}
    deadline = time.monotonic() + timeout_s
    ok = False
    try:
        while len(outputs) < world_size:
            errors: dict[int, str] = {}
            for status, rank, payload in inbox.receive(0.2):
                if status == "err":  # every error of the batch: the first may be a symptom
                    errors.setdefault(rank, payload)
                else:
                    outputs[rank] = _load(payload)
            if errors:
                raise _root_cause(procs, inbox, outputs, errors)
            _check_alive(procs, outputs, deadline, timeout_s)
            _check_heartbeats(beats, procs, outputs)
        ok = True
    finally:
        reap(procs, grace_s=5.0 if ok else 0.0)
        inbox.close()
    return [outputs[r] for r in range(world_size)]


def _rendezvous_store(timeout_s: float) -> Any:
    """The ranks' rendezvous: a ``TCPStore`` served by the launcher on a port the kernel picks
    and this process keeps bound - two runs started at once can never meet on one port (a
    port found free, released, then bound by rank 0 could be taken in between)."""
    import torch.distributed as dist

    return dist.TCPStore("127.0.0.1", 0, None, True, timeout=timedelta(seconds=timeout_s),
                         wait_for_workers=False)  # fmt: skip


def _start_ranks(ctx: Any, settings: tuple, beats: Heartbeats) -> tuple[list[Any], list[Any]]:
    """Start one process per rank; returns them and the launcher's ends of their pipes."""
    world_size, port, backend, device, timeout_s, threads, job = settings
    pipes = [ctx.Pipe(duplex=False) for _ in range(world_size)]  # (launcher end, rank end)
    procs = [
        ctx.Process(
            target=_worker,
            args=(os.getpid(), r, world_size, port, backend, device, timeout_s, threads, job,
                  pipes[r][1], beats.beat_args(f"rank {r}")),
            daemon=True,
        )
        for r in range(world_size)
    ]  # fmt: skip
    # SIGINT stays blocked from the exec until the rank ignores it: a Ctrl-C while the ranks
    # start up reaches the launcher only, not half-started ranks printing tracebacks
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        for p in procs:
            p.start()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
    for _, rank_end in pipes:
        rank_end.close()  # the rank holds its own copy; EOF then means the rank is gone
    return procs, [launcher_end for launcher_end, _ in pipes]


def _load(payload: bytes) -> Any:
    import torch

    return torch.load(io.BytesIO(payload), weights_only=False)


class _Inbox:
    """The launcher's ends of the ranks' pipes: results and errors."""

    def __init__(self, conns: list[Any]) -> None:
        self.conns = conns
        self.open = set(range(len(conns)))

    def receive(self, timeout_s: float) -> list[tuple[str, int, Any]]:
        """Results and errors that arrived within ``timeout_s``."""
        out: list[tuple[str, int, Any]] = []
        ready = wait([self.conns[r] for r in self.open], timeout=timeout_s)
        for r in list(self.open):
            conn = self.conns[r]
            if conn not in ready:
                continue
            try:
                while conn.poll():
                    out.append(conn.recv())
            except (EOFError, OSError):  # the rank exited; its exit code tells how
                self.open.discard(r)
        return out

    def close(self) -> None:
        for conn in self.conns:
            conn.close()


def _check_heartbeats(beats: Heartbeats, procs: list[Any], outputs: dict[int, Any]) -> None:
    """Raise for a rank that is running, has not reported, and stopped beating."""
    waiting = [f"rank {r}" for r, p in enumerate(procs) if r not in outputs and p.is_alive()]
    hung = beats.hung(waiting)
    if hung is not None:
        name, message = hung
        raise RankFailure(int(name.split()[1]), message)


def _check_alive(
    procs: list[Any], outputs: dict[int, Any], deadline: float, timeout_s: float
) -> None:
    for r, p in enumerate(procs):
        if r not in outputs and not p.is_alive() and p.exitcode not in (0, None):
            raise RankFailure(r, f"rank {r} died with exit code {p.exitcode} before reporting")
    if time.monotonic() > deadline:
        waiting = [r for r in range(len(procs)) if r not in outputs]
        raise RankFailure(
            waiting[0] if waiting else None,
            f"timed out after {timeout_s:g}s waiting for rank(s) {waiting}; "
            "raise timeout_s if the job is just slow",
        )


# Errors that a rank raises because a *peer* went away; they are symptoms, not causes.
_PEER_SYMPTOMS = (
    "Connection reset",
    "Connection closed",
    "Broken pipe",
    "pair.cc",
    "NCCL communicator was aborted",
)


def _root_cause(
    procs: list[Any], inbox: _Inbox, outputs: dict[int, Any], errors: dict[int, str]
) -> RankFailure:
    """The failure to show: a rank that died silently, else the first error that is not
    merely a reaction to a dead peer. Other ranks get one second to report theirs."""
    end = time.monotonic() + 1.0
    while time.monotonic() < end:
        for status, rank, payload in inbox.receive(0.1):
            if status == "err":
                errors.setdefault(rank, payload)
            else:
                outputs[rank] = None
    for r, p in enumerate(procs):
        if (
            r not in outputs
            and r not in errors
            and not p.is_alive()
            and p.exitcode not in (0, None)
        ):
            return RankFailure(r, f"rank {r} died with exit code {p.exitcode} before reporting")
    causes = [r for r, tb in errors.items() if not any(s in tb for s in _PEER_SYMPTOMS)]
    rank = causes[0] if causes else next(iter(errors))
    first_line = errors[rank].splitlines()[0] if errors[rank] else "unknown error"
    return RankFailure(rank, f"rank {rank} failed: {first_line}", errors[rank])
