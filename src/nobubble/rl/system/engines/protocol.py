"""What the orchestrator and its engines say to each other: messages, the engine protocol,
and the failure a run reports: :class:`~nobubble.distributed.WorkerError`, naming the stage
worker or environment actor (the one supervisor's, :mod:`nobubble.distributed.supervisor`).

Both :mod:`~nobubble.rl.system.orchestrator` and the engines import this
module, so neither imports the other at module level.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from nobubble.distributed import WorkerError
from nobubble.rl.system.config import RunConfig
from nobubble.rl.system.types import GroupRequest, SampleGroup, Span

__all__ = ["WorkerError", "Message", "Engine"]


@dataclass(frozen=True)
class Message:
    """A stage's answer to the orchestrator.

    ``kind``: ``ready`` | ``rollout`` | ``reward`` | ``train`` | ``eval``; ``worker``: which
    worker; ``payload``: groups (rollout, reward), a TrainResult, or an EvalResult;
    ``spans``: busy spans to add to the timeline; ``weights``: for ``train``, the engine's
    handle to the published weights (None where the engine publishes itself); ``state``:
    for ``rollout``, the generator's RNG state after the call (checkpoints keep it).
    """

    kind: str
    worker: str
    payload: Any = None
    spans: tuple[Span, ...] = ()
    weights: Any = None
    state: Any = None


class Engine(Protocol):
    """Where the stages run. Every ``submit_*`` returns at once; results come from ``poll``."""

    def start(self, cfg: RunConfig) -> list[str]: ...  # worker names by stage prefix

    def submit_rollout(
        self,
        worker: str,
        requests: list[GroupRequest],
        weights: Any,
        rng_state: Any = None,  # set the generator's RNG first (a resumed run)
    ) -> None: ...

    def submit_reward(self, worker: str, groups: list[SampleGroup]) -> None: ...

    def submit_train(
        self,
        groups: list[SampleGroup],
        evaluate: bool,
        checkpoint: str | None = None,  # a folder: the trainer writes its checkpoint file there
        weights: list[float] | None = None,  # per group (replay IS weights); None = all 1
    ) -> None: ...

    def submit_eval(self) -> None: ...

    def poll(self, timeout_s: float) -> list[Message]: ...  # raises WorkerError

    def restart(self, worker: str) -> None: ...  # a fresh worker of that name; it says ready

    def shutdown(self) -> None: ...
