"""Process-group context, a local spawner that never hangs, and the one supervisor of every
process nobubble starts.

Distributed code in nobubble receives a :class:`DistContext` (rank, world size, backend,
device, group, timeout) instead of reading globals. Two ways to get one:

- :func:`spawn` starts ``world_size`` local processes, one per rank, and returns every
  rank's result, or raises :class:`RankFailure` naming the rank that raised, died, stopped
  beating for ``liveness_s``, or outlived ``timeout_s`` (:mod:`nobubble.distributed.ranks`).
- :func:`context_from_env` for processes launched by ``torchrun`` (multi-host capable): it
  reads ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``/``MASTER_PORT``.

Supervision (:mod:`nobubble.distributed.supervisor`) is the same for spawn's ranks, the RL
local engine's workers and the actor-learner's actors: each runs under :func:`supervised`
(dies with the launcher, writes its heartbeat into a shared slot of
:mod:`~nobubble.distributed.liveness`, reports its error by name and exits 1), the launcher's
:class:`Supervisor` turns a report, an exit or a silence of ``liveness_s`` (default
:data:`LIVENESS_S`) into one :class:`WorkerError` naming the worker (:class:`RankFailure`
for spawn's ranks), and :func:`reap` ends them all - a stopped one with SIGKILL - so nothing
is left running.
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
from nobubble.distributed.liveness import (
    BEAT_S,
    LIVENESS_S,
    STARTUP_S,
    Heartbeats,
    reap,
    start_beating,
)
from nobubble.distributed.ranks import RankFailure, spawn
from nobubble.distributed.supervisor import (
    Supervisor,
    Ward,
    WorkerError,
    looks_like_peer_failure,
    supervised,
)
from nobubble.lifetime import die_with_parent, launcher_alive

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
