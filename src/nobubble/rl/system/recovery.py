"""Checkpoints and recovery of a run: the driver's part of a checkpoint, resume, restarts.

:class:`Recovery` is the half of :class:`~nobubble.rl.system.orchestrator.Orchestrator` that
keeps a run whole across a crash or a dead worker. Its contract:

- what a checkpoint holds: checkpoints are taken at step boundaries. The trainer writes its
  part (weights, optimizer) into the folder :meth:`Recovery._checkpoint_dir` names when the
  step is submitted; once that step's result is back, :meth:`Recovery._commit_checkpoint`
  writes :meth:`Recovery._snapshot` beside it and commits the folder
  (:class:`~nobubble.rl.system.checkpoint.CheckpointStore`): the version, the next group
  id, the prompt RNG, the buffer and ledger, the request of every group in flight, the
  curve and the metrics so far, the generators' RNG states and the replay;
- resume: :meth:`Recovery._check_resume` restores the newest checkpoint before any worker
  starts (or refuses to overwrite one without ``resume``, or to resume a run whose
  :data:`~nobubble.rl.system.checkpoint.RESUME_KEYS` changed). Every group that was in
  flight, and every batch queued at the trainer but not trained, is generated or trained
  again with the same group and prompt ids; so no sample is lost or trained twice;
- restarts: with ``restart_workers``, :meth:`Recovery._restart` replaces a rollout or
  reward worker that died (at most :data:`MAX_RESTARTS` times each) and requeues the groups
  it held. A trainer failure is never masked.

The ledger records every requeue (``resumed`` or ``worker_died``).
"""

from __future__ import annotations

import random
import time
from collections import Counter, deque
from pathlib import Path
from typing import Any

from nobubble.rl.system.checkpoint import RESUME_KEYS, CheckpointStore
from nobubble.rl.system.config import RunConfig
from nobubble.rl.system.engines.protocol import Engine, WorkerError
from nobubble.rl.system.experience import ExperienceBuffer
from nobubble.rl.system.replay import GroupReplay
from nobubble.rl.system.result import CurvePoint
from nobubble.rl.system.types import GroupRequest, SampleGroup
from nobubble.rl.system.weight_sync import PublishedWeights

__all__ = ["MAX_RESTARTS", "Recovery"]

MAX_RESTARTS = 3  # per worker, with restart_workers


class Recovery:
    """Checkpoint, resume and restart, mixed into the orchestrator (see the module docstring).

    The annotations below are the orchestrator's state this part reads and writes; the
    recovery state itself is made by :meth:`_init_recovery`.
    """

    cfg: RunConfig
    engine: Engine
    buffer: ExperienceBuffer[SampleGroup]
    _rng: random.Random
    _version: int
    _next_group: int
    _stopping: bool
    _t0: float
    _train_queue: deque[tuple[list[SampleGroup], list[SampleGroup]]]
    _replay: GroupReplay | None
    _in_flight: dict[int, str]
    _idle_rollout: list[str]
    _idle_reward: list[str]
    _pending_reward: list[SampleGroup]
    _curve: list[CurvePoint]
    _staleness: Counter[int]
    _token_staleness: Counter[int]
    _group_versions: dict[int, list[int]]
    _published: PublishedWeights
    _train_reward: float | None
    _step_metrics: list[dict[str, float]]

    def _init_recovery(self, cfg: RunConfig) -> None:
        # the request behind every group in flight, what each worker holds, the groups to
        # generate again first, generator RNG states to hand back after a resume
        self._requests: dict[int, GroupRequest] = {}
        self._assigned: dict[str, list[int]] = {}
        self._requeue: list[GroupRequest] = []
        self._rollout_rng: dict[str, Any] = {}
        self._rng_to_send: dict[str, Any] = {}
        self._restarts: list[str] = []
        self._store = CheckpointStore(cfg.checkpoint_dir) if cfg.checkpoint_dir else None
        self._checkpoint: dict[int, str] = {}  # step -> folder the trainer writes into
        self._wall_offset = 0.0
        self._resumed_from: str | None = None

    def _requeue_group(self, req: GroupRequest, reason: str) -> None:
        self.buffer.requeue(req.group_id, reason)
        self._in_flight[req.group_id] = "rollout"
        self._requests[req.group_id] = req
        self._requeue.append(req)

    def _checkpoint_dir(self, step: int) -> str | None:
        """The folder the trainer writes step ``step``'s checkpoint into (None: no checkpoint)."""
        every = self.cfg.checkpoint_every
        if self._store is None or not (step == self.cfg.steps or (every and step % every == 0)):
            return None
        ckpt = str(self._store.new_dir(step))
        self._checkpoint[step] = ckpt
        return ckpt

    def _commit_checkpoint(self, version: int) -> None:
        """After step ``version`` trained: add the driver's part and commit its checkpoint."""
        ckpt = self._checkpoint.pop(version, None)
        if ckpt is not None and self._store is not None:
            self._store.commit(Path(ckpt), self._snapshot())

    def _snapshot(self) -> dict[str, Any]:
        """The driver's part of a checkpoint, at a step boundary."""
        return {
            "config": self.cfg.to_dict(),
            "version": self._version,
            "next_group": self._next_group,
            "rng": self._rng.getstate(),
            "buffer": self._buffer_state(),
            "in_flight": [self._requests[g] for g in sorted(self._in_flight)],
            "curve": list(self._curve),
            "staleness": dict(self._staleness),
            "token_staleness": dict(self._token_staleness),
            "group_versions": dict(self._group_versions),
            "published": self._published.state_dict(),
            "train_reward": self._train_reward,
            "rollout_rng": dict(self._rollout_rng),
            "replay": self._replay,
            "step_metrics": list(self._step_metrics),
            "wall_s": time.time() - self._t0,
        }

    def _buffer_state(self) -> dict[str, Any]:
        """The buffer as a checkpoint keeps it: a batch queued at the trainer (prefetched,
        not trained) is back among the ready groups, so a resumed run trains it."""
        state = self.buffer.state_dict()
        queued = [g for batch, _ in self._train_queue for g in batch]
        state["ready"] = sorted([*state["ready"], *queued], key=lambda g: g.group_id)
        return state

    def _check_resume(self) -> None:
        """Restore the newest checkpoint (``resume``), or refuse to overwrite one."""
        if self._store is None:
            return
        ckpt = self._store.latest()
        if ckpt is None:  # resume=True on an empty folder: refused by RunConfig
            return
        if not self.cfg.resume:
            raise ValueError(
                f"checkpoint_dir {self._store.folder} holds a checkpoint ({ckpt.name}); "
                "resume from it (--resume) or choose an empty folder"
            )
        state = self._store.load_state(ckpt)
        now = self.cfg.to_dict()
        diff = [k for k in RESUME_KEYS if state["config"].get(k) != now.get(k)]
        if diff:
            shown = ", ".join(f"{k}: {state['config'].get(k)!r} -> {now.get(k)!r}" for k in diff)
            raise ValueError(f"cannot resume {ckpt}: the run's config changed ({shown})")
        self._version = state["version"]
        self._next_group = state["next_group"]
        self._rng.setstate(state["rng"])
        self.buffer.load_state_dict(state["buffer"])
        for req in state["in_flight"]:
            self._requeue_group(req, "resumed")
        self._curve = list(state["curve"])
        self._staleness = Counter(state["staleness"])
        self._token_staleness = Counter(state.get("token_staleness", {}))
        self._group_versions = dict(state["group_versions"])
        if "published" not in state:
            raise ValueError(
                "the checkpoint was written before weight digests were recorded; start a new "
                "run in an empty checkpoint folder"
            )
        self._published.load_state_dict(state["published"])
        self._train_reward = state["train_reward"]
        self._rollout_rng = dict(state["rollout_rng"])
        self._rng_to_send = dict(state["rollout_rng"])
        self._replay = state.get("replay", self._replay)
        self._step_metrics = list(state.get("step_metrics", []))
        self._wall_offset = float(state["wall_s"])
        self._resumed_from = str(ckpt)
        if self._version >= self.cfg.steps:
            self._stopping = True

    def _restart(self, err: WorkerError) -> None:
        """Replace the worker ``err`` blames and requeue the groups it held."""
        worker = err.worker
        if worker is None or worker.startswith("trainer") or not self.cfg.restart_workers:
            raise err
        if sum(r.split(":")[0] == worker for r in self._restarts) >= MAX_RESTARTS:
            raise WorkerError(f"{worker} failed {MAX_RESTARTS + 1} times; last: {err}", worker)
        self._restarts.append(f"{worker}: {str(err).splitlines()[0]}")
        for idle in (self._idle_rollout, self._idle_reward):
            if worker in idle:
                idle.remove(worker)
        for gid in self._assigned.pop(worker, []):
            self._pending_reward = [g for g in self._pending_reward if g.group_id != gid]
            self._requeue_group(self._requests[gid], "worker_died")
        self._rng_to_send.pop(worker, None)
        self.engine.restart(worker)
