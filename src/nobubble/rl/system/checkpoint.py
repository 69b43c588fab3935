"""Checkpoints of an RL run at step boundaries, and the resume from the newest one.

A checkpoint is a folder ``step-<N>-<token>/`` holding ``trainer.pt`` (the trainer's part)
and ``orchestrator.pt`` (the driver's :class:`RunProgress` and the groups in flight), plus the
pointer ``latest``. Each file is a dict stamped with :data:`LAYOUT`, which a reader checks
first. Files are written atomically and ``latest`` moves only once both exist, so a crash at
any point leaves the previous checkpoint whole; ``<token>`` is new per driver process, so a
trainer left over from a killed run never writes into the resumed run's folders.
"""

from __future__ import annotations

import os
import random
import secrets
import shutil
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nobubble.files import atomic_path, write_text

if TYPE_CHECKING:
    from nobubble.rl.system.config import RunConfig
    from nobubble.rl.system.experience import GroupReplay
    from nobubble.rl.system.result import CurvePoint
    from nobubble.rl.system.weight_sync import PublishedWeights

__all__ = [
    "LAYOUT",
    "TRAINER_FILE",
    "STATE_FILE",
    "CheckpointStore",
    "save_trainer",
    "load_trainer",
    "RESUME_KEYS",
    "RunProgress",
]

TRAINER_FILE = "trainer.pt"
STATE_FILE = "orchestrator.pt"
LAYOUT = 1
"""The layout of both files (their ``"layout"``): raise it whenever what they hold changes.
A file of another layout is refused; an unnumbered one is layout 1 if it holds layout 1's
keys and no older layout's (``rng``, a buffer ``ledger``): the files written just before
layouts were numbered, whose runs resume."""
_LAYOUT_1_KEYS = {
    TRAINER_FILE: ("model", "optimizer", "version", "torch_rng", "reference"),
    STATE_FILE: ("config", "progress", "buffer", "in_flight", "wall_s"),
}
# the config fields a resumed run must share with the checkpoint (the rest may change:
# steps, time budget, timeouts, workers, faults); the replay too: its buffer is restored
RESUME_KEYS = (
    "task",
    "task_kwargs",
    "mode",
    "max_staleness",
    "algo",
    "seed",
    "batch_groups",
    "group_size",
    "policy",
    "policy_kwargs",
    "replay",
)


def _save(state: dict[str, Any], path: Path) -> None:
    import torch

    with atomic_path(path) as tmp:
        torch.save({**state, "layout": LAYOUT}, tmp)


def _load(ckpt: Path, name: str) -> dict[str, Any]:
    """The file ``name`` of the checkpoint folder ``ckpt``; ValueError if not of :data:`LAYOUT`."""
    import torch

    state = torch.load(ckpt / name, weights_only=False)
    found = state.get("layout") if isinstance(state, dict) else None
    if found is None and isinstance(state, dict) and _holds_layout_1(state, name):
        found = 1  # unnumbered, written just before layouts were numbered
    if found != LAYOUT:
        has = "no checkpoint layout" if found is None else f"checkpoint layout {found!r}"
        raise ValueError(
            f"{ckpt} was written by {'an older' if found is None else 'another'} nobubble "
            f"({has}; this one reads layout {LAYOUT}); start a new run in an empty "
            "checkpoint folder"
        )
    return state


def _holds_layout_1(state: dict[str, Any], name: str) -> bool:
    older = "rng" in state or "ledger" in (state.get("buffer") or {})
    return not older and all(k in state for k in _LAYOUT_1_KEYS[name])


def save_trainer(ckpt: str | os.PathLike[str], learner: Any) -> None:
    """Write ``learner``'s part of a checkpoint into the folder ``ckpt`` atomically: its
    model, optimizer and version, torch's RNG, and the KL penalty's reference policy (when
    there is one)."""
    import torch

    reference = learner.loss.reference
    state = {
        "model": learner.model.state_dict(),
        "optimizer": learner.optimizer.state_dict(),
        "version": learner.version,
        "torch_rng": torch.get_rng_state(),
        "reference": None if reference is None else reference.state_dict(),
    }
    _save(state, Path(ckpt) / TRAINER_FILE)


def load_trainer(ckpt: str | os.PathLike[str], learner: Any) -> None:
    """Load the trainer's part of the checkpoint folder ``ckpt`` into ``learner`` (its
    model, optimizer, version and reference policy) and torch's RNG."""
    import torch

    state = _load(Path(ckpt), TRAINER_FILE)
    learner.model.load_state_dict(state["model"])
    if learner.loss.reference is not None and state["reference"] is not None:
        learner.loss.reference.load_state_dict(state["reference"])
    learner.optimizer.load_state_dict(state["optimizer"])
    torch.set_rng_state(state["torch_rng"])
    learner.version = int(state["version"])


class CheckpointStore:
    """The checkpoint ``folder`` of one run (created on the first checkpoint): its
    checkpoints, of which it keeps the ``keep`` (>= 1) newest complete, ``latest``, the resume."""

    def __init__(self, folder: str | os.PathLike[str], keep: int = 2) -> None:
        if keep < 1:
            raise ValueError(f"keep={keep} must be >= 1")
        self.folder = Path(folder)
        self.keep = keep
        self._token = secrets.token_hex(3)

    def latest(self) -> Path | None:
        """The newest complete checkpoint, or None when there is none."""
        pointer = self.folder / "latest"
        if not pointer.is_file():
            return None
        ckpt = self.folder / pointer.read_text().strip()
        if not (ckpt / TRAINER_FILE).is_file() or not (ckpt / STATE_FILE).is_file():
            raise ValueError(
                f"{pointer} names {ckpt.name}, which is incomplete; remove {pointer} to start over"
            )
        return ckpt

    def new_dir(self, step: int) -> Path:
        """The folder for the checkpoint at ``step`` (the trainer writes into it first)."""
        path = self.folder / f"step-{step:06d}-{self._token}"
        path.mkdir(parents=True, exist_ok=True)
        return path

    def commit(self, ckpt: Path, state: dict[str, Any]) -> None:
        """Write the driver's part (``state``, stamped with :data:`LAYOUT`) into ``ckpt``,
        point ``latest`` at it, prune old ones."""
        if not (ckpt / TRAINER_FILE).is_file():
            raise RuntimeError(
                f"checkpoint {ckpt} has no {TRAINER_FILE}; the trainer did not write it"
            )
        _save(state, ckpt / STATE_FILE)
        write_text(self.folder / "latest", ckpt.name + "\n")
        self._prune(ckpt)

    def _prune(self, newest: Path) -> None:
        done = sorted(
            (p for p in self.folder.glob("step-*") if (p / STATE_FILE).is_file()),
            key=lambda p: p.stat().st_mtime,
        )
        keep = {newest, *done[-self.keep :]}
        for p in self.folder.glob("step-*"):
            if p in keep or not p.is_dir():
                continue
            mine = p.name.endswith(f"-{self._token}")
            if mine and not (p / STATE_FILE).is_file():
                continue  # this run's next checkpoint, which the trainer may be writing now
            shutil.rmtree(p, ignore_errors=True)

    def resume(self, cfg: RunConfig) -> dict[str, Any] | None:
        """The driver's state in the newest checkpoint, its folder added as
        ``resumed_from``; None when there is none (a new run). ValueError: the folder holds a
        checkpoint and ``cfg.resume`` is off, the checkpoint is not of :data:`LAYOUT`, or the
        run's config changed in one of :data:`RESUME_KEYS`."""
        ckpt = self.latest()
        if ckpt is None:  # resume=True on an empty folder: refused by RunConfig
            return None
        if not cfg.resume:
            raise ValueError(
                f"checkpoint_dir {self.folder} holds a checkpoint ({ckpt.name}); "
                "resume from it (--resume) or choose an empty folder"
            )
        state = _load(ckpt, STATE_FILE)
        now = cfg.to_dict()
        diff = [k for k in RESUME_KEYS if state["config"].get(k) != now.get(k)]
        if diff:
            shown = ", ".join(f"{k}: {state['config'].get(k)!r} -> {now.get(k)!r}" for k in diff)
            raise ValueError(f"cannot resume {ckpt}: the run's config changed ({shown})")
        return {**state, "resumed_from": str(ckpt)}


@dataclass
class RunProgress:
    """The driver's state of a run that a checkpoint saves (this object, pickled) and a
    resume restores: the prompt sampler's RNG, each version's weight digest, the replay,
    and what the run has done so far."""

    rng: random.Random
    published: PublishedWeights
    replay: GroupReplay | None
    version: int = 0  # newest version the trainer has published
    next_group: int = 0  # the id the next admitted group gets
    curve: list[CurvePoint] = field(default_factory=list)  # evaluation points
    staleness: Counter[int] = field(default_factory=Counter)  # lag -> trained samples
    token_staleness: Counter[int] = field(default_factory=Counter)  # lag -> trained tokens
    # group id -> the policy version of each of its samples
    group_versions: dict[int, list[int]] = field(default_factory=dict)
    train_reward: float | None = None  # the mean reward of the last trained batch
    step_metrics: list[dict[str, float]] = field(default_factory=list)  # the trainer's, per step
    rollout_rng: dict[str, Any] = field(default_factory=dict)  # generator -> its RNG state
