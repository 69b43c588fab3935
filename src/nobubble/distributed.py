"""Process-group context and a local spawner that never hangs.

Distributed code in nobubble receives a :class:`DistContext` (rank, world size, backend,
device, group, timeout) instead of reading globals. Two ways to get one:

- :func:`spawn` starts ``world_size`` local processes, one per rank, initialises a
  torch.distributed group in each (gloo on CPU by default; NCCL with ``device="cuda"``), calls
  ``fn(ctx, *args)`` and returns every rank's result. A rank that raises makes ``spawn``
  terminate the others and raise :class:`RankFailure` carrying that rank's traceback; a rank
  that dies without a word, one whose heartbeat stops (stopped, or wedged holding the
  interpreter) for ``liveness_s``, or a run past ``timeout_s``, is reported the same way.
  Nothing waits forever. Results and heartbeats travel through one pipe per rank, so a
  killed launcher leaves no named semaphore in ``/dev/shm`` behind; ranks ignore SIGINT
  (the launcher stops them), turn SIGTERM into ``SystemExit`` so their ``finally`` blocks
  run, and die with the launcher (the parent-death signal).
- :func:`context_from_env` for processes launched by ``torchrun`` (multi-host capable): it
  reads ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``/``MASTER_PORT``.
"""

from __future__ import annotations

import io
import multiprocessing as mp
import os
import pickle
import signal
import socket
import sys
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from multiprocessing.connection import wait
from typing import TYPE_CHECKING, Any

from nobubble.lifetime import die_with_parent, launcher_alive

if TYPE_CHECKING:  # torch is imported where it is used: a rank beats before it loads
    import torch
    import torch.distributed as dist

__all__ = [
    "DistContext",
    "RankFailure",
    "spawn",
    "context_from_env",
    "free_port",
    "default_backend",
    "die_with_parent",
    "launcher_alive",
    "worker_context",
    "LIVENESS_S",
    "BEAT_S",
    "STARTUP_S",
]

LIVENESS_S = 30.0
"""Default seconds without a heartbeat after which :func:`spawn` declares a rank hung."""
_PRELOAD = ["torch", "torch.distributed"]  # what the forkserver imports before forking
BEAT_S = 1.0  # how often a rank's heartbeat thread writes
STARTUP_S = 30.0  # a rank that never beat yet (the interpreter starting) gets this long


def default_backend(device: str | torch.device) -> str:
    """NCCL for CUDA devices, gloo otherwise."""
    import torch

    return "nccl" if torch.device(device).type == "cuda" else "gloo"


@dataclass(frozen=True)
class DistContext:
    """Everything a rank needs to talk to its peers.

    Attributes:
        rank: this process's global rank.
        world_size: number of ranks.
        backend: torch.distributed backend (``"gloo"``, ``"nccl"``).
        device: the device this rank computes on (``cpu``, ``cuda:LOCAL_RANK``).
        local_rank: rank within this host.
        local_world_size: ranks on this host.
        timeout_s: the limit for any single collective or point-to-point wait.
        group: the process group (``None`` = the default group).
    """

    rank: int
    world_size: int
    backend: str
    device: torch.device
    local_rank: int = 0
    local_world_size: int = 1
    timeout_s: float = 120.0
    group: dist.ProcessGroup | None = field(default=None, compare=False)


class RankFailure(RuntimeError):
    """One rank of a spawned job failed; ``rank`` and ``remote_traceback`` say where and why."""

    def __init__(self, rank: int | None, message: str, remote_traceback: str = "") -> None:
        self.rank = rank
        self.remote_traceback = remote_traceback
        super().__init__(message)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def context_from_env(
    *, device: str | None = None, backend: str | None = None, timeout_s: float = 300.0
) -> DistContext:
    """Initialise the default group from torchrun's environment and describe it.

    ``device`` defaults to ``cuda:LOCAL_RANK`` when CUDA is available, else ``cpu``.
    """
    import torch
    import torch.distributed as dist

    for var in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        if var not in os.environ:
            raise ValueError(
                f"context_from_env: {var} is not set; launch with torchrun or use nobubble's spawn()"
            )
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    if device is None:
        device = f"cuda:{local_rank}" if torch.cuda.is_available() else "cpu"
    dev = torch.device(device)
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    backend = backend or default_backend(dev)
    if not dist.is_initialized():
        dist.init_process_group(backend, timeout=timedelta(seconds=timeout_s))
    return DistContext(rank, world, backend, dev, local_rank, local_world, timeout_s)


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
) -> None:
    """One rank: heartbeat first, then torch and the job (``(fn, args)``, unpickled here),
    so the launcher hears from the rank while torch imports (seconds on a loaded machine)."""
    die_with_parent(parent_pid)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the launcher, which stops us
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})  # blocked from the start
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    sys.unraisablehook = _exit_if_unraisable_exit
    lock = threading.Lock()

    def put(message: tuple) -> None:
        with lock:
            conn.send(message)

    threading.Thread(target=_heartbeat, args=(put, rank), daemon=True).start()
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


def _heartbeat(put: Callable[[tuple], None], rank: int) -> None:
    """Tell the launcher every ``BEAT_S`` that this process still runs Python code."""
    while True:
        try:
            put(("beat", rank, b""))
        except (OSError, ValueError):  # the pipe closed: the launcher is gone or done
            return
        time.sleep(BEAT_S)


def worker_context() -> Any:
    """The ``multiprocessing`` context nobubble starts its ranks and workers with: the
    forkserver, preloaded with torch. A worker is a fork of a process that imported torch once
    (tens of milliseconds, not the seconds of a fresh interpreter per worker); the server
    holds no CUDA or thread state, so the fork is safe, and it exits with the launcher. Each
    worker still unpickles its target by module, as under ``spawn``."""
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(_PRELOAD)
    return ctx


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
    backend = backend or default_backend(device)
    job = _Job(fn, tuple(args))  # unpickled by the rank after its heartbeat starts
    store = _rendezvous_store(timeout_s)  # held until the ranks are reaped
    settings = (world_size, store.port, backend, device, timeout_s, threads_per_rank, job)
    procs, pipes = _start_ranks(settings)
    inbox = _Inbox(pipes)
    outputs: dict[int, Any] = {}
    deadline = time.monotonic() + timeout_s
    ok = False
    try:
        while len(outputs) < world_size:
            for status, rank, payload in inbox.receive(0.2):
                if status == "err":
                    raise _root_cause(procs, inbox, outputs, {rank: payload})
                outputs[rank] = _load(payload)
            _check_alive(procs, outputs, deadline, timeout_s)
            _check_heartbeats(inbox, outputs, liveness_s)
        ok = True
    finally:
        _reap(procs, grace_s=5.0 if ok else 0.0)
        inbox.close()
    return [outputs[r] for r in range(world_size)]


def _rendezvous_store(timeout_s: float) -> Any:
    """The ranks' rendezvous: a ``TCPStore`` served by the launcher on a port the kernel picks
    and this process keeps bound - two runs started at once can never meet on one port (a
    port found free, released, then bound by rank 0 could be taken in between)."""
    import torch.distributed as dist

    return dist.TCPStore("127.0.0.1", 0, None, True, timeout=timedelta(seconds=timeout_s),
                         wait_for_workers=False)  # fmt: skip


def _start_ranks(settings: tuple) -> tuple[list[Any], list[Any]]:
    """Start one process per rank; returns them and the launcher's ends of their pipes."""
    world_size, port, backend, device, timeout_s, threads, job = settings
    ctx = worker_context()
    pipes = [ctx.Pipe(duplex=False) for _ in range(world_size)]  # (launcher end, rank end)
    procs = [
        ctx.Process(
            target=_worker,
            args=(os.getpid(), r, world_size, port, backend, device, timeout_s, threads, job,
                  pipes[r][1]),
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
    """The launcher's ends of the ranks' pipes: results, errors and heartbeats."""

    def __init__(self, conns: list[Any]) -> None:
        self.conns = conns
        self.open = set(range(len(conns)))
        self.started = time.monotonic()
        self.last_beat: dict[int, float] = {}

    def receive(self, timeout_s: float) -> list[tuple[str, int, Any]]:
        """Results and errors that arrived within ``timeout_s`` (heartbeats are noted)."""
        out: list[tuple[str, int, Any]] = []
        ready = wait([self.conns[r] for r in self.open], timeout=timeout_s)
        for r in list(self.open):
            conn = self.conns[r]
            if conn not in ready:
                continue
            try:
                while conn.poll():
                    status, rank, payload = conn.recv()
                    self.last_beat[rank] = time.monotonic()
                    if status != "beat":
                        out.append((status, rank, payload))
            except (EOFError, OSError):  # the rank exited; its exit code tells how
                self.open.discard(r)
        return out

    def silent_for(self, rank: int) -> float:
        """Seconds since ``rank``'s last message (since the start if it never sent one)."""
        return time.monotonic() - self.last_beat.get(rank, self.started)

    def close(self) -> None:
        for conn in self.conns:
            conn.close()


def _check_heartbeats(inbox: _Inbox, outputs: dict[int, Any], liveness_s: float | None) -> None:
    if liveness_s is None:
        return
    for r in sorted(inbox.open - set(outputs)):
        limit = liveness_s if r in inbox.last_beat else max(liveness_s, STARTUP_S)
        silent = inbox.silent_for(r)
        if silent > limit:
            raise RankFailure(
                r,
                f"rank {r} stopped responding: no heartbeat for {silent:.0f}s (liveness_s="
                f"{liveness_s:g}); it is stopped (SIGSTOP), swapping, or stuck holding the "
                "interpreter",
            )


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


def _reap(procs: list[Any], grace_s: float) -> None:
    """Give ranks ``grace_s`` to exit cleanly, then terminate and finally kill stragglers."""
    end = time.monotonic() + grace_s
    for p in procs:
        p.join(timeout=max(0.0, end - time.monotonic()))
    for p in procs:
        if p.is_alive():
            p.terminate()
    for p in procs:
        p.join(timeout=2.0)
        if p.is_alive():
            p.kill()
            p.join(timeout=2.0)
