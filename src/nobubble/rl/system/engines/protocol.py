"""What the engines send the orchestrator (:class:`Message`) and the failure a run reports
(:class:`~nobubble.distributed.WorkerError`, naming the stage worker). Both the
orchestrator and the engines import this module, so neither imports the other."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from nobubble.distributed import WorkerError
from nobubble.rl.system.types import Span

__all__ = ["WorkerError", "Message"]


@dataclass(frozen=True)
class Message:
    """A stage's answer to the orchestrator.

    ``kind``: ``ready`` | ``rollout`` | ``reward`` | ``train`` | ``shard`` | ``eval``;
    ``worker``: which worker; ``payload``: groups (rollout, reward), a TrainResult, an
    EvalResult, or the node (ready); ``spans``: busy spans for the timeline; ``weights``: for
    learner 0's ``ready`` and ``train``, the engine's handle to the published weights (None
    where the generators read them from the engine's weight source); ``state``: for
    ``rollout``, the generator's RNG state after the call (checkpoints keep it).
    """

    kind: str
    worker: str
    payload: Any = None
    spans: tuple[Span, ...] = ()
    weights: Any = None
    state: Any = None
