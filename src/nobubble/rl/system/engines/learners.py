"""Many learners: L trainer workers in one torch.distributed group, one step per batch.

``RunConfig.learners = L`` makes the trainer stage L workers, ``trainer`` (learner 0) and
``trainer-1`` .. ``trainer-<L-1>``, that join one gloo group (:func:`join_learner_group`;
the trainer runs on CPU) on a free port of 127.0.0.1 (the local engine) or of learner 0's
node (Ray actors). Every collective and point-to-point wait is bounded by
``RunConfig.stall_timeout_s``.

The driver splits each batch into L contiguous shards of whole groups
(:func:`split_groups`: a GRPO group never spans learners, so "one policy version per group"
still holds); each learner trains its shard and the gradients combine by
``RunConfig.aggregation`` inside the one :class:`~nobubble.rl.system.learner.Learner`.
Learner 0 publishes the weights and reports the step; the other learners report their
shard (a ``shard`` message), which :class:`StepCollector` merges into the single ``train``
message the orchestrator sees (``TrainResult.trained_by``, then the ledger). In ``async``
and ``staleness`` learner 0 publishes a version only once every gradient of its batch is
applied, so a batch is the unit of publication.
"""

from __future__ import annotations

from collections import Counter, deque
from dataclasses import replace
from datetime import timedelta

import torch
import torch.distributed as dist

from nobubble.distributed import DistContext, default_backend
from nobubble.rl.system.engines.protocol import Message, WorkerError
from nobubble.rl.system.trainer import TrainResult
from nobubble.rl.system.types import SampleGroup

__all__ = [
    "learner_names",
    "learner_rank",
    "split_groups",
    "join_learner_group",
    "StepCollector",
]


def learner_names(num_learners: int) -> list[str]:
    """``["trainer", "trainer-1", ...]``: learner 0 keeps the one-learner name."""
    return ["trainer", *(f"trainer-{r}" for r in range(1, num_learners))]


def learner_rank(name: str) -> int:
    """The learner index of a trainer worker's name (``trainer`` = 0)."""
    return int(name.split("-")[1]) if "-" in name else 0


def split_groups(
    groups: list[SampleGroup], weights: list[float] | None, num_learners: int
) -> list[tuple[list[SampleGroup], list[float] | None]]:
    """Contiguous shards of whole groups, one per learner, sizes differing by at most one
    (the first ``len(groups) % L`` shards take one more); ``weights`` split alike."""
    if not 1 <= num_learners <= len(groups):
        raise ValueError(
            f"split_groups: {len(groups)} groups for {num_learners} learners; every learner "
            "needs >= 1 group (learners <= batch_groups)"
        )
    base, extra = divmod(len(groups), num_learners)
    out, start = [], 0
    for r in range(num_learners):
        end = start + base + (r < extra)
        out.append((groups[start:end], None if weights is None else weights[start:end]))
        start = end
    return out


def join_learner_group(
    rank: int, num_learners: int, host: str, port: int, timeout_s: float
) -> DistContext:
    """Join the learners' group (this process's default group; a learner process or actor
    belongs to one run only) and return its context."""
    backend = default_backend("cpu")
    dist.init_process_group(
        backend,
        init_method=f"tcp://{host}:{port}",
        rank=rank,
        world_size=num_learners,
        timeout=timedelta(seconds=timeout_s),
    )
    device = torch.device("cpu")
    return DistContext(rank, num_learners, backend, device, rank, num_learners, timeout_s)


class StepCollector:
    """In the driver: merges the L learners' answers to one batch into one ``train`` message.

    Lifecycle of a batch: :meth:`expect` (sent: the group ids of each shard) -> learner 0's
    ``train`` message and every other learner's ``shard`` message arrive (each learner
    answers its batches in order) -> released as one message whose ``TrainResult`` has
    learner 0's version, span and published weights, every learner's staleness (in shard
    order, so in batch order), metrics averaged over learners weighted by their groups
    (learner 0's own extras kept) and ``trained_by`` for every group. Learner 0's ``eval``
    messages stay behind the ``train`` message they follow. Invariant: a learner that
    reports other groups than it was sent is an error, so a released step proves that
    every group of the batch was trained, and by whom.
    """

    def __init__(self, num_learners: int) -> None:
        self.num_learners = num_learners
        self._expected: deque[list[list[int]]] = deque()
        self._reports: dict[int, deque[Message]] = {r: deque() for r in range(1, num_learners)}
        self._held: deque[Message] = deque()

    def expect(self, shards: list[list[int]]) -> None:
        self._expected.append(shards)

    def feed(self, msgs: list[Message]) -> list[Message]:
        out = []
        for m in msgs:
            if m.kind == "shard":
                self._reports[learner_rank(m.worker)].append(m)
            elif m.worker == "trainer" and m.kind in ("train", "eval"):
                self._held.append(m)
            else:
                out.append(m)
        while self._held:
            m = self._held[0]
            if m.kind == "train":
                if not all(self._reports.values()):
                    break
                m = self._merge(m, [self._reports[r].popleft() for r in self._reports])
            out.append(m)
            self._held.popleft()
        return out

    def _merge(self, msg: Message, reports: list[Message]) -> Message:
        expected = self._expected.popleft()
        results: list[TrainResult] = [msg.payload, *(r.payload for r in reports)]
        trained_by: dict[int, int] = {}
        for rank, (res, ids) in enumerate(zip(results, expected, strict=True)):
            if sorted(res.trained_by) != sorted(ids) or set(res.trained_by.values()) != {rank}:
                raise WorkerError(
                    f"{learner_names(self.num_learners)[rank]} reported groups "
                    f"{sorted(res.trained_by)} for step {results[0].version}, was sent {ids}",
                    learner_names(self.num_learners)[rank],
                )
            trained_by.update(res.trained_by)
        sizes = [len(ids) for ids in expected]
        metrics = dict(results[0].metrics)
        for key in set.intersection(*(set(r.metrics) for r in results)):
            metrics[key] = sum(n * r.metrics[key] for n, r in zip(sizes, results)) / sum(sizes)
        staleness = [lag for r in results for lag in r.staleness]
        tokens = sum((Counter(r.token_staleness) for r in results), Counter())
        res = replace(
            results[0], staleness=staleness, metrics=metrics, trained_by=trained_by,
            token_staleness=dict(sorted(tokens.items())),
        )  # fmt: skip
        spans = (*msg.spans, *(s for r in reports for s in r.spans))
        return Message("train", msg.worker, res, spans, msg.weights, msg.state)
