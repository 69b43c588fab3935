"""The actor processes of one run and their channels to the learner, per architecture.

:class:`ActorPool` lifecycle: built (processes started) -> :meth:`receive` /
:meth:`supervise` while the learner runs -> :meth:`close` (stop flag, drain the channel,
then :func:`~nobubble.distributed.reap`: SIGTERM, SIGKILL for a stopped actor or a
straggler). Invariant: after :meth:`close` no actor process is alive and every trajectory an
actor sent is either returned by :meth:`receive` or by :meth:`close`, so the ledger can
account for all of them.

Supervision is the one of every nobubble process (:class:`~nobubble.distributed.Supervisor`):
each actor runs under :func:`~nobubble.distributed.supervised`, and :meth:`supervise` names
one that reported an error, exited, or fell silent for
:data:`~nobubble.distributed.LIVENESS_S`, with a :class:`~nobubble.distributed.WorkerError`.

- impala: a :class:`~nobubble.rl.system.weight_sync.SharedWeights` slot the learner
  publishes into and every actor pulls from before each unroll, and one bounded trajectory
  queue (its bound is the backpressure that keeps the lag small).
- seed / sample-factory: one pipe and one (seed) or two (sample-factory) shared-memory
  :class:`~nobubble.rl.actor_learner.shm.EnvSlot` per worker, served by
  :class:`~nobubble.rl.actor_learner.inference.CentralInference`.
"""

from __future__ import annotations

import multiprocessing as mp
import queue as queue_module
import time
from multiprocessing.connection import wait
from typing import Any, cast

from torch import nn

from nobubble.distributed import LIVENESS_S, Supervisor, WorkerError, reap
from nobubble.rl.actor_learner.actors import ActorSpec, env_worker, impala_actor
from nobubble.rl.actor_learner.config import EnvRunConfig, envs_per_trajectory
from nobubble.rl.actor_learner.inference import CentralInference
from nobubble.rl.actor_learner.model import PolicyModel
from nobubble.rl.actor_learner.shm import EnvSlot
from nobubble.rl.actor_learner.trajectory import Trajectory
from nobubble.rl.system.weight_sync import SharedWeights

__all__ = ["ActorPool"]


class ActorPool:
    """Starts ``config.actors`` actor processes for ``config.arch``; ``liveness_s``: silence
    after which :meth:`supervise` names an actor (None: never)."""

    def __init__(
        self, config: EnvRunConfig, model: PolicyModel, liveness_s: float | None = LIVENESS_S
    ) -> None:
        self.config, self.model = config, model
        self._module = cast(nn.Module, model)  # every PolicyModel is an nn.Module
        ctx: Any = mp.get_context(config.start_method)
        self.stop, self.errors = ctx.Event(), ctx.Queue()
        self.names = [f"actor-{i}" for i in range(config.actors)]
        self.supervisor = Supervisor(ctx, self.names, liveness_s)
        specs = [
            ActorSpec(n, i, config, model.obs_dim, model.num_actions, self.supervisor.ward(n))
            for i, n in enumerate(self.names)
        ]
        self.inference: CentralInference | None = None
        self.weights: SharedWeights | None = None
        if config.arch == "impala":
            self.weights = SharedWeights(self._module, ctx)
            self.queue = ctx.Queue(maxsize=2 * config.actors)
            args: list[tuple[Any, ...]] = [
                (s, self.weights, self.queue, self.stop, self.errors) for s in specs
            ]
            target: Any = impala_actor
        else:
            groups = 2 if config.arch == "sample-factory" else 1
            per_group = envs_per_trajectory(config)
            slots = [[EnvSlot(ctx, per_group, model.obs_dim) for _ in range(groups)] for _ in specs]
            pipes = [ctx.Pipe(duplex=True) for _ in specs]
            self.inference = CentralInference(
                model, config, self.names, slots, [p[0] for p in pipes]
            )
            args = [(s, sl, p[1], self.stop, self.errors) for s, sl, p in zip(specs, slots, pipes)]
            target = env_worker
        for a, n in zip(args, self.names):
            proc = ctx.Process(target=target, args=a, name=n, daemon=True)
            proc.start()
            self.supervisor.procs[n] = proc

    @property
    def procs(self) -> list[Any]:
        """The actor processes, in :attr:`names`' order (the supervisor's, held once)."""
        return list(self.supervisor.procs.values())

    def publish(self, version: int) -> None:
        """impala: hand the learner's weights to the actors as ``version`` (no-op otherwise)."""
        if self.weights is not None:
            self.weights.publish(self._module, version, timeout_s=self.config.stall_timeout_s)

    def receive(self, version: int, digest: str = "", poll_s: float = 0.1) -> list[Trajectory]:
        """Finished trajectories (possibly none) after waiting at most about ``poll_s``;
        ``digest``: the learner's published digest of ``version`` (central inference acts with
        the learner's own model)."""
        if self.inference is not None:
            try:
                return self.inference.poll(version, digest, poll_s)
            except WorkerError:  # a pipe closed: its process ended; find its own report
                wait([p.sentinel for p in self.procs], timeout=self.config.stall_timeout_s)
                self.supervise()
                raise
        return _drain(self.queue, poll_s)

    def supervise(self) -> None:
        """Raise :class:`~nobubble.distributed.WorkerError` naming an actor that reported an
        error, exited, or fell silent."""
        self.supervisor.check(self._reports(0.0), self._reports)

    def _reports(self, timeout_s: float) -> dict[str, str]:
        """The actors' error reports that arrived within ``timeout_s`` (each actor's first)."""
        reports: dict[str, str] = {}
        for name, text in _drain(self.errors, timeout_s):
            reports.setdefault(name, text)
        return reports

    def close(self, grace_s: float = 5.0) -> list[Trajectory]:
        """Stop every actor; return the trajectories still in transit."""
        self.stop.set()
        leftover: list[Trajectory] = []
        deadline = time.monotonic() + grace_s
        waited = [p for p in self.procs if p.name not in self.supervisor.failed]
        while any(p.is_alive() for p in waited) and time.monotonic() < deadline:
            if self.inference is None:  # a full queue would keep its feeder from exiting
                leftover.extend(self.receive(-1, poll_s=0.05))
            else:
                time.sleep(0.02)
        reap(self.procs, grace_s=0.1)  # a stopped actor (SIGSTOP) is killed at once
        if self.inference is None:
            leftover.extend(self.receive(-1, poll_s=0.05))
        return leftover


def _drain(queue: Any, timeout_s: float) -> list[Any]:
    """What ``queue`` holds after waiting at most ``timeout_s`` for its first item."""
    items: list[Any] = []
    try:
        items.append(queue.get(timeout=timeout_s))
        while True:
            items.append(queue.get_nowait())
    except queue_module.Empty:
        pass
    return items
