"""What the orchestrator and its engines say to each other: messages (the commands and the
engines' shared side are :mod:`~nobubble.rl.system.engines.worker`'s), and the failure a run
reports: :class:`~nobubble.distributed.WorkerError`, naming the stage worker or environment
actor (the one supervisor's, :mod:`nobubble.distributed.supervisor`).

Both :mod:`~nobubble.rl.system.orchestrator` and the engines import this
module, so neither imports the other at module level.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from nobubble.distributed import WorkerError
from nobubble.rl.system.types import Span

__all__ = ["WorkerError", "Message"]


@dataclass(frozen=True)
class Message:
    """A stage's answer to the orchestrator.

    ``kind``: ``ready`` | ``rollout`` | ``reward`` | ``train`` | ``eval``; ``worker``: which
    worker; ``payload``: groups (rollout, reward), a TrainResult, or an EvalResult;
    ``spans``: busy spans to add to the timeline; ``weights``: for learner 0's ``ready`` and
    ``train``, the engine's handle to the published weights (None where the generators read
    them from the engine's :class:`~nobubble.rl.system.weight_sync.WeightSource`); ``state``:
    for ``rollout``, the generator's RNG state after the call (checkpoints keep it).
    """

    kind: str
    worker: str
    payload: Any = None
    spans: tuple[Span, ...] = ()
    weights: Any = None
    state: Any = None
