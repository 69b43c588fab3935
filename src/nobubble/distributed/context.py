"""What a rank knows about its process group (:class:`DistContext`, built under ``torchrun`` by
:func:`context_from_env`), device checks, and the ``multiprocessing`` context every rank and
worker of nobubble starts from (:func:`worker_context`).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import multiprocessing as mp
import os
import re
import socket
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # torch is imported where it is used: a rank beats before it loads
    import torch
    import torch.distributed as dist

__all__ = [
    "DistContext",
    "context_from_env",
    "default_backend",
    "free_port",
    "worker_context",
]

_PRELOAD = ["torch", "torch.distributed"]  # what the forkserver imports before forking


def default_backend(device: str | torch.device) -> str:
    """NCCL for CUDA devices, gloo otherwise."""
    import torch

    return "nccl" if torch.device(device).type == "cuda" else "gloo"


BACKENDS = ("gloo", "nccl", "mpi")


def check_device_name(device: str | torch.device, backend: str | None = None) -> None:
    """The half of :func:`check_device` that needs no torch (it runs in milliseconds, before
    a command imports anything heavy): ``device`` is ``cpu`` or ``cuda`` (``cuda:N``) and
    ``backend`` one torch.distributed knows."""
    if not re.fullmatch(r"(cpu|cuda)(:\d+)?", str(device)):
        raise ValueError(f"device {device!r}: nobubble runs on cpu or cuda (cuda:N)")
    if backend is not None and backend not in BACKENDS:
        raise ValueError(f"backend {backend!r} is unknown; use one of {', '.join(BACKENDS)}")
    if _gpu_build() is False:  # the same words as check_device's, seconds earlier
        version = importlib.metadata.version("torch")
        if str(device).startswith("cuda"):
            raise ValueError(f"device {device!r}: this torch ({version}) has no CUDA; use cpu")
        if backend == "nccl":
            raise ValueError(f"backend 'nccl' is not in this torch build ({version})")


def _gpu_build() -> bool | None:
    """Whether the installed torch was built for GPUs (its CUDA or ROCm library is there),
    found without importing it; None when that cannot be told."""
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        return None
    lib = Path(next(iter(spec.submodule_search_locations))) / "lib"
    if not lib.is_dir():
        return None
    return any(lib.glob("libtorch_cuda*")) or any(lib.glob("libtorch_hip*"))


def check_device(device: str, backend: str | None = None, *, ranks: int = 1) -> None:
    """Refuse, before any process starts, a device or backend that this torch build or this
    machine does not have (ValueError naming it and what there is)."""
    import torch
    import torch.distributed as dist

    check_device_name(device, backend)
    kind = torch.device(device).type
    if kind == "cuda":
        have = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if have == 0:
            build = "has no CUDA" if torch.version.cuda is None else "sees no GPU"
            raise ValueError(f"device {device!r}: this torch ({torch.__version__}) {build}; "
                             "use cpu")  # fmt: skip
        if ranks > have:
            raise ValueError(f"device {device!r}: {ranks} ranks need {ranks} GPUs, {have} seen")
        index = torch.device(device).index
        if index is not None and index >= have:
            raise ValueError(f"device {device!r}: this machine has GPUs 0..{have - 1}")
    if backend is None:
        return
    available = {"gloo": dist.is_gloo_available, "nccl": dist.is_nccl_available,
                 "mpi": dist.is_mpi_available}[backend]()  # fmt: skip
    if not available:
        raise ValueError(f"backend {backend!r} is not in this torch build ({torch.__version__})")
    if backend == "nccl" and kind != "cuda":
        raise ValueError("backend 'nccl' runs on GPUs; use --device cuda or backend gloo")


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


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun_rank(who: str) -> tuple[int, int]:
    """``(RANK, WORLD_SIZE)`` of torchrun's environment; ValueError naming ``who`` when a
    variable torchrun sets (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT) is missing."""
    for var in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        if var not in os.environ:
            raise ValueError(
                f"{who}: {var} is not set; launch with torchrun or use nobubble's spawn()"
            )
    return int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])


def context_from_env(
    *, device: str | None = None, backend: str | None = None, timeout_s: float = 300.0
) -> DistContext:
    """Initialise the default group from torchrun's environment and describe it.

    ``device`` defaults to ``cuda:LOCAL_RANK`` when CUDA is available, else ``cpu``.
    """
    import torch
    import torch.distributed as dist

    rank, world = torchrun_rank("context_from_env")
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


def worker_context() -> Any:
    """The ``multiprocessing`` context nobubble starts its ranks and workers with: the
    forkserver, preloaded with torch (a worker forks in milliseconds from a process without
    CUDA or thread state, which exits with the launcher)."""
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(_PRELOAD)
    return ctx
