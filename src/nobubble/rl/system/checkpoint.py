"""Checkpoints of an RL run: what survives a ``kill -9``, and how a run resumes from it.

A checkpoint is a folder ``step-<N>-<token>/`` under the run's checkpoint folder with two
files, and the one-line pointer ``latest`` that names the newest complete one:

- ``trainer.pt`` - written by the trainer process itself: policy and optimizer state, the
  weight version, torch's RNG state, the KL reference policy;
- ``orchestrator.pt`` - written by the driver: the experience buffer (scored groups waiting
  for the trainer), the replay, the ledger, the groups in flight (requeued on resume under their group
  and prompt ids), the prompt sampler's RNG, each generator's RNG, the curve, and the
  config it was taken under.

Every file is written atomically (a temporary file, fsync, rename), and ``latest`` moves
only after both files of a checkpoint exist, so a crash at any point leaves the previous
checkpoint whole. ``<token>`` is new for every driver process: a trainer left over from a
killed run can never write into the folder of the run that resumed. The two newest
checkpoints are kept. Torch is imported by the functions that read and write the files, so
the driver checks ``resume`` (:meth:`CheckpointStore.latest`) before torch loads.
"""

from __future__ import annotations

import os
import secrets
import shutil
from pathlib import Path
from typing import Any

from nobubble.files import atomic_path, write_text

__all__ = [
    "TRAINER_FILE",
    "STATE_FILE",
    "CheckpointStore",
    "save_trainer",
    "load_trainer",
    "RESUME_KEYS",
]

TRAINER_FILE = "trainer.pt"
STATE_FILE = "orchestrator.pt"
# the config fields a resumed run must share with the checkpoint (the rest may change:
# steps, time budget, timeouts, workers, faults)
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
)


def _save(obj: Any, path: Path) -> None:
    import torch

    with atomic_path(path) as tmp:
        torch.save(obj, tmp)


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

    state = torch.load(Path(ckpt) / TRAINER_FILE, weights_only=False)
    learner.model.load_state_dict(state["model"])
    if learner.loss.reference is not None and state.get("reference") is not None:
        learner.loss.reference.load_state_dict(state["reference"])
    learner.optimizer.load_state_dict(state["optimizer"])
    torch.set_rng_state(state["torch_rng"])
    learner.version = int(state["version"])


class CheckpointStore:
    """The checkpoint folder of one run (see the module docstring).

    Args:
        folder: where checkpoints go (created on the first one).
        keep: how many complete checkpoints to keep (>= 1).
    """

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
        """Write the driver's part into ``ckpt``, point ``latest`` at it, prune old ones."""
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

    @staticmethod
    def load_state(ckpt: Path) -> dict[str, Any]:
        import torch

        return torch.load(ckpt / STATE_FILE, weights_only=False)
