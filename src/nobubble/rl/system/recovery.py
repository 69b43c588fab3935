"""Checkpoints and recovery of a run: the driver's part of a checkpoint, resume, restarts.

:class:`Recovery` is the part of :class:`~nobubble.rl.system.orchestrator.Orchestrator` that
keeps a run whole across a crash or a dead worker. It holds no state of the run; the
orchestrator passes in what it saves and applies what it gets back. Its contract:

- what a checkpoint holds: checkpoints are taken at step boundaries. The trainer writes its
  part (weights, optimizer) into the folder :meth:`Recovery.checkpoint_dir` names when the
  step is submitted; once that step's result is back, :meth:`Recovery.commit` writes the
  driver's part beside it and commits the folder
  (:class:`~nobubble.rl.system.checkpoint.CheckpointStore`): :class:`RunProgress` (the
  version, the next group id, the curve, the metrics so far, the generators' RNG states),
  the prompt RNG, the buffer and ledger, the request of every group in flight and the
  replay;
- resume: :meth:`Recovery.resume` returns the newest checkpoint's driver state before any
  worker starts (or refuses to overwrite one without ``resume``, or to resume a run whose
  :data:`~nobubble.rl.system.checkpoint.RESUME_KEYS` changed). The orchestrator generates
  every group that was in flight again, and trains again every batch that was queued at the
  trainer but not trained, with the same group and prompt ids; so no sample is lost or
  trained twice;
- restarts: with ``restart_workers``, :meth:`Recovery.restart` allows the restart of a
  rollout or reward worker that died (at most :data:`MAX_RESTARTS` times each); the
  orchestrator then requeues the groups it held. A trainer failure is never masked.

The ledger records every requeue (``resumed`` or ``worker_died``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nobubble.rl.system.checkpoint import RESUME_KEYS, CheckpointStore
from nobubble.rl.system.config import RunConfig
from nobubble.rl.system.engines.protocol import WorkerError
from nobubble.rl.system.result import CurvePoint
from nobubble.rl.system.weight_sync import PublishedWeights

__all__ = ["MAX_RESTARTS", "Recovery", "RunProgress"]

MAX_RESTARTS = 3  # per worker, with restart_workers


@dataclass
class RunProgress:
    """What a run has done so far: the counters a checkpoint saves (this object, pickled)
    and a resume restores.

    Attributes:
        version: newest version the trainer has published.
        next_group: the id the next admitted group gets.
        curve: evaluation points so far.
        staleness: trained samples by their lag ``{lag: count}``.
        token_staleness: trained response tokens by their lag.
        group_versions: group id -> the policy version of each of its samples.
        published: each published version's weight digest.
        train_reward: the mean reward of the last trained batch.
        step_metrics: the trainer's metrics of every step.
        rollout_rng: each generator's RNG state, as it last reported it.
    """

    version: int = 0
    next_group: int = 0
    curve: list[CurvePoint] = field(default_factory=list)
    staleness: Counter[int] = field(default_factory=Counter)
    token_staleness: Counter[int] = field(default_factory=Counter)
    group_versions: dict[int, list[int]] = field(default_factory=dict)
    published: PublishedWeights = field(default_factory=PublishedWeights)
    train_reward: float | None = None
    step_metrics: list[dict[str, float]] = field(default_factory=list)
    rollout_rng: dict[str, Any] = field(default_factory=dict)


class Recovery:
    """Checkpoint, resume and restart policy of one run of ``cfg`` (see the module docstring).

    Attributes:
        restarts: ``"<worker>: <error>"`` for every worker restarted so far.
        resumed_from: the checkpoint folder the run resumed from (None: a new run).
        wall_offset: the wall-clock seconds the run had spent before it resumed.
    """

    def __init__(self, cfg: RunConfig) -> None:
        self.cfg = cfg
        self.restarts: list[str] = []
        self.resumed_from: str | None = None
        self.wall_offset = 0.0
        self._store = CheckpointStore(cfg.checkpoint_dir) if cfg.checkpoint_dir else None
        self._dirs: dict[int, str] = {}  # step -> folder the trainer writes into

    def checkpoint_dir(self, step: int) -> str | None:
        """The folder the trainer writes step ``step``'s checkpoint into (None: no checkpoint)."""
        every = self.cfg.checkpoint_every
        if self._store is None or not (step == self.cfg.steps or (every and step % every == 0)):
            return None
        ckpt = str(self._store.new_dir(step))
        self._dirs[step] = ckpt
        return ckpt

    def commit(self, step: int, snapshot: Callable[[], dict[str, Any]]) -> None:
        """After step ``step`` trained: if it has a checkpoint, write the driver's part
        (``snapshot()``, the orchestrator's
        :meth:`~nobubble.rl.system.orchestrator.Orchestrator.snapshot`) and commit it."""
        ckpt = self._dirs.pop(step, None)
        if ckpt is not None and self._store is not None:
            self._store.commit(Path(ckpt), {"config": self.cfg.to_dict(), **snapshot()})

    def resume(self) -> dict[str, Any] | None:
        """The driver's state in the newest checkpoint (``resume``), or None for a new run.

        Raises:
            ValueError: the folder holds a checkpoint and ``resume`` is off, or the run's
                config changed in one of ``RESUME_KEYS``.
        """
        if self._store is None:
            return None
        ckpt = self._store.latest()
        if ckpt is None:  # resume=True on an empty folder: refused by RunConfig
            return None
        if not self.cfg.resume:
            raise ValueError(
                f"checkpoint_dir {self._store.folder} holds a checkpoint ({ckpt.name}); "
                "resume from it (--resume) or choose an empty folder"
            )
        state = self._store.load_state(ckpt)
        if "progress" not in state:
            raise ValueError(
                f"{ckpt} was written before weight digests were recorded; start a new run in "
                "an empty checkpoint folder"
            )
        now = self.cfg.to_dict()
        diff = [k for k in RESUME_KEYS if state["config"].get(k) != now.get(k)]
        if diff:
            shown = ", ".join(f"{k}: {state['config'].get(k)!r} -> {now.get(k)!r}" for k in diff)
            raise ValueError(f"cannot resume {ckpt}: the run's config changed ({shown})")
        self.wall_offset = float(state["wall_s"])
        self.resumed_from = str(ckpt)
        return state

    def restart(self, err: WorkerError) -> str:
        """The worker ``err`` blames, once it may be restarted; re-raises ``err`` when not
        (no ``restart_workers``, the trainer, or a worker past :data:`MAX_RESTARTS`)."""
        worker = err.worker
        if worker is None or worker.startswith("trainer") or not self.cfg.restart_workers:
            raise err
        if sum(r.split(":")[0] == worker for r in self.restarts) >= MAX_RESTARTS:
            raise WorkerError(f"{worker} failed {MAX_RESTARTS + 1} times; last: {err}", worker)
        self.restarts.append(f"{worker}: {str(err).splitlines()[0]}")
        return worker
