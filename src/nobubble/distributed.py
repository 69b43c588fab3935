"""Process-group context and a local spawner that never hangs.

Distributed code in nobubble receives a :class:`DistContext` (rank, world size, backend,
device, group, timeout) instead of reading globals. Two ways to get one:

- :func:`spawn` starts ``world_size`` local processes, one per rank, initialises a
  torch.distributed group in each (gloo on CPU by default; NCCL with ``device="cuda"``), calls
  ``fn(ctx, *args)`` and returns every rank's result. A rank that raises makes ``spawn``
  terminate the others and raise :class:`RankFailure` carrying that rank's traceback; a rank
  that dies without a word, or a run past ``timeout_s``, is reported the same way. Nothing
  waits forever.
- :func:`context_from_env` for processes launched by ``torchrun`` (multi-host capable): it
  reads ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``/``MASTER_PORT``.
"""

from __future__ import annotations

import ctypes
import io
import multiprocessing as mp
import os
import queue
import signal
import socket
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

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
]


def default_backend(device: str | torch.device) -> str:
    """NCCL for CUDA devices, gloo otherwise."""
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


def die_with_parent(parent_pid: int) -> None:
    """Make this process die when ``parent_pid`` (its launcher) does (Linux: the
    parent-death signal), so a killed ``nobubble`` command leaves no worker behind it."""
    if sys.platform != "linux":
        return
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    if os.getppid() != parent_pid:  # the launcher died before the signal was armed
        os._exit(1)


def _worker(
    parent_pid: int,
    rank: int,
    world_size: int,
    port: int,
    backend: str,
    device: str,
    timeout_s: float,
    threads: int,
    fn: Callable[..., Any],
    args: tuple,
    results: Any,
) -> None:
    die_with_parent(parent_pid)
    torch.set_num_threads(threads)
    try:
        dev = torch.device(device)
        if dev.type == "cuda":
            dev = torch.device("cuda", rank % max(torch.cuda.device_count(), 1))
            torch.cuda.set_device(dev)
        dist.init_process_group(
            backend,
            init_method=f"tcp://127.0.0.1:{port}",
            rank=rank,
            world_size=world_size,
            timeout=timedelta(seconds=timeout_s),
        )
        ctx = DistContext(rank, world_size, backend, dev, rank, world_size, timeout_s)
        out = fn(ctx, *args)
        buf = io.BytesIO()
        torch.save(out, buf)  # tensors and plain objects alike; no shared-memory handles
        results.put(("ok", rank, buf.getvalue()))
    except BaseException as err:  # noqa: BLE001 - every failure must reach the parent
        results.put(("err", rank, f"{type(err).__name__}: {err}\n{traceback.format_exc()}"))
    finally:
        if dist.is_initialized():
            try:
                dist.destroy_process_group()
            except Exception:  # noqa: BLE001 - the group may be broken by a failed peer
                pass


def spawn(
    fn: Callable[..., Any],
    world_size: int,
    *,
    args: Sequence[Any] = (),
    backend: str | None = None,
    device: str = "cpu",
    timeout_s: float = 120.0,
    threads_per_rank: int = 1,
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
    Raises:
        RankFailure: a rank raised (its traceback is attached), died, or the job timed out.
    """
    if world_size < 1:
        raise ValueError(f"spawn: world_size={world_size} must be >= 1")
    if timeout_s <= 0:
        raise ValueError(f"spawn: timeout_s={timeout_s} must be > 0")
    backend = backend or default_backend(device)
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    port = free_port()
    procs = [
        ctx.Process(
            target=_worker,
            args=(
                os.getpid(),
                r,
                world_size,
                port,
                backend,
                device,
                timeout_s,
                threads_per_rank,
                fn,
                tuple(args),
                results,
            ),
            daemon=True,
        )
        for r in range(world_size)
    ]
    for p in procs:
        p.start()
    outputs: dict[int, Any] = {}
    deadline = time.monotonic() + timeout_s
    ok = False
    try:
        while len(outputs) < world_size:
            try:
                status, rank, payload = results.get(timeout=0.2)
            except queue.Empty:
                _check_alive(procs, outputs, deadline, timeout_s)
                continue
            if status == "err":
                raise _root_cause(procs, results, outputs, {rank: payload})
            outputs[rank] = torch.load(io.BytesIO(payload), weights_only=False)
        ok = True
    finally:
        _reap(procs, grace_s=5.0 if ok else 0.0)
    return [outputs[r] for r in range(world_size)]


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
    procs: list[Any], results: Any, outputs: dict[int, Any], errors: dict[int, str]
) -> RankFailure:
    """The failure to show: a rank that died silently, else the first error that is not
    merely a reaction to a dead peer. Other ranks get one second to report theirs."""
    end = time.monotonic() + 1.0
    while time.monotonic() < end:
        try:
            status, rank, payload = results.get(timeout=0.1)
        except queue.Empty:
            continue
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
