"""Process groups and the processes nobubble starts: :class:`DistContext` (what a rank knows,
handed to distributed code instead of globals), :func:`spawn` (local ranks that never hang:
every failure raised as a :class:`RankFailure` naming the rank), :func:`context_from_env`
(under ``torchrun``) and the one supervisor of every process (:mod:`.supervisor`).
"""

from nobubble.distributed.context import (
    DistContext,
    check_device,
    check_device_name,
    context_from_env,
    default_backend,
    free_port,
    worker_context,
)
from nobubble.distributed.ranks import RankFailure, spawn
from nobubble.distributed.supervisor import (
    BEAT_S,
    LIVENESS_S,
    STARTUP_S,
    Heartbeats,
    Supervisor,
    Ward,
    WorkerError,
    die_with_parent,
    launcher_alive,
    looks_like_peer_failure,
    reap,
    start_beating,
    supervised,
)

__all__ = [
    "DistContext",
    "RankFailure",
    "spawn",
    "context_from_env",
    "free_port",
    "default_backend",
    "check_device",
    "check_device_name",
    "die_with_parent",
    "launcher_alive",
    "worker_context",
    "LIVENESS_S",
    "BEAT_S",
    "STARTUP_S",
    "Heartbeats",
    "start_beating",
    "reap",
    "WorkerError",
    "Supervisor",
    "Ward",
    "supervised",
    "looks_like_peer_failure",
]
