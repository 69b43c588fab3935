"""Many learners: L trainer workers in one torch.distributed group, one step per batch.

``RunConfig.learners = L`` makes the trainer stage L workers, ``trainer`` (learner 0) and
``trainer-1`` .. ``trainer-<L-1>``, that join one gloo group (the trainer runs on CPU; a
CUDA trainer would take NCCL, :func:`~nobubble.distributed.default_backend`) on a free port
of 127.0.0.1 (the local engine) or of learner 0's node (Ray actors). Every collective and
point-to-point wait is bounded by ``RunConfig.stall_timeout_s``.

The driver splits each batch into L contiguous shards of whole groups
(:func:`split_groups`: sizes differ by at most one; a GRPO group never spans learners, so
"one policy version per group" still holds). Each learner computes its shard's gradient
(:meth:`~nobubble.rl.system.trainer.Trainer.compute_gradients`); the gradients combine
by ``RunConfig.aggregation``, all with the toolbox of :mod:`nobubble.rl.algo.aggregation`:

- ``sync``: :func:`~nobubble.rl.algo.aggregation.all_reduce_gradients` with each learner's
  weight = its response-token count. Every term of the trainer's loss is a token mean over
  the response mask, so ``sum_r n_r grad(mean_r) / sum_r n_r = grad(mean over the batch)``:
  every learner then clips and steps its own Adam on the same gradient and holds the
  parameters of one learner trained on the whole batch (equal up to rounding).
- ``async``: learner 0 is a parameter server
  (:class:`~nobubble.rl.algo.aggregation.ParameterServer`, Adam at the trainer's lr). The
  other learners load the newest *published* weights, compute and clip their gradient and
  send it to learner 0 (:func:`~nobubble.rl.algo.aggregation.send_versioned`); learner 0
  computes its own shard meanwhile (a
  :class:`~nobubble.rl.algo.aggregation.VersionedInbox` receives) and applies every
  gradient in arrival order, at full weight. A push's staleness is the number
  of server updates between the parameters it was computed on and its application.
- ``staleness``: as ``async``, each push scaled by ``1 / (1 + staleness)`` (Adam normalises
  the update, so the scale mostly tempers the first moments of a stale push).
- ``local-sgd``: every learner steps its own Adam on its own shard;
  :class:`~nobubble.rl.algo.aggregation.LocalSGD` averages the parameters every H steps.

Learner 0 publishes the weights and reports the step; the other learners report their
shard (a ``shard`` message). :class:`StepCollector`, in the driver, merges the L answers to
one batch into the single ``train`` message the orchestrator sees, checks that each learner
trained exactly the groups it was sent, and records which learner trained each group
(``TrainResult.trained_by``, then the ledger). In ``async`` and ``staleness`` learner 0
publishes a version only once every gradient of its batch is applied, so a batch is the
unit of publication while the gradients inside it never wait for each other.
"""

from __future__ import annotations

import time
from collections import Counter, deque
from dataclasses import replace
from datetime import timedelta

import torch
import torch.distributed as dist

from nobubble.distributed import DistContext, default_backend
from nobubble.rl.algo.aggregation import (
    LocalSGD,
    ParameterServer,
    VersionedInbox,
    all_reduce_gradients,
    broadcast_parameters,
    send_versioned,
)
from nobubble.rl.system.protocol import Message, WorkerError
from nobubble.rl.system.trainer import Trainer, TrainResult
from nobubble.rl.system.types import SampleGroup, Span

__all__ = [
    "learner_names",
    "learner_rank",
    "split_groups",
    "join_learner_group",
    "Learner",
    "StepCollector",
    "looks_like_peer_failure",
]

# what a learner raises when a *peer* went away: a symptom, not the cause
_PEER_SYMPTOMS = ("Connection reset", "Connection closed", "Broken pipe", "pair.cc")


def learner_names(num_learners: int) -> list[str]:
    """``["trainer", "trainer-1", ...]``: learner 0 keeps the one-learner name."""
    return ["trainer", *(f"trainer-{r}" for r in range(1, num_learners))]


def learner_rank(name: str) -> int:
    """The learner index of a trainer worker's name (``trainer`` = 0)."""
    return int(name.split("-")[1]) if "-" in name else 0


def looks_like_peer_failure(text: str) -> bool:
    """Whether a learner's error reads as a reaction to a peer that died."""
    return any(s in text for s in _PEER_SYMPTOMS)


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


def _grads(params: list[torch.nn.Parameter]) -> list[torch.Tensor]:
    """Each parameter's gradient, zeros where it has none (a head the loss did not use)."""
    return [torch.zeros_like(p) if p.grad is None else p.grad for p in params]


class Learner:
    """One learner of L: its :class:`Trainer`, its place in the group, the aggregation.

    ``step`` trains one shard and returns its :class:`TrainResult`: learner 0's is the
    batch's step (new version), the others' report their shard (``trained_by`` = this
    learner for every group). In ``async`` / ``staleness`` a learner other than 0 computes
    on the weights its trainer holds (loaded by the engine from the newest published ones,
    ``trainer.version`` set to their version) and never steps an optimizer itself.
    """

    def __init__(self, trainer: Trainer, ctx: DistContext, aggregation: str, local_sgd_every: int):
        self.trainer = trainer
        self.ctx = ctx
        self.aggregation = aggregation
        self.params = [p for p in trainer.model.parameters() if p.requires_grad]
        broadcast_parameters(self.params, ctx)  # every learner starts from learner 0's
        self._server: ParameterServer | None = None
        self._local_sgd: LocalSGD | None = None
        if aggregation in ("async", "staleness") and ctx.rank == 0:
            lr = trainer.cfg.lr
            self._server = ParameterServer(
                self.params,
                optimizer_factory=lambda ps: torch.optim.Adam(ps, lr=lr),
                staleness_kind="inverse" if aggregation == "staleness" else "none",
            )
            # published version -> server version then (what a push was computed on)
            self._server_version_at = {trainer.version: 0}
        elif aggregation == "local-sgd":
            self._local_sgd = LocalSGD(self.params, sync_every=local_sgd_every, ctx=ctx)

    def step(self, groups: list[SampleGroup], weights: list[float] | None) -> TrainResult:
        start = time.time()
        if self.aggregation == "sync":
            res = self._sync_step(groups, weights, start)
        elif self.aggregation == "local-sgd":
            res = self.trainer.train_step(groups, weights)
            assert self._local_sgd is not None  # built for local-sgd
            res.metrics["params_averaged"] = float(self._local_sgd.after_step())
        elif self.ctx.rank == 0:
            res = self._serve_step(groups, weights, start)
        else:
            res = self._push_step(groups, weights, start)
        return replace(res, trained_by=dict.fromkeys((g.group_id for g in groups), self.ctx.rank))

    def _sync_step(
        self, groups: list[SampleGroup], weights: list[float] | None, start: float
    ) -> TrainResult:
        grads = self.trainer.compute_gradients(groups, weights)
        all_reduce_gradients(self.params, self.ctx, op="mean", weight=float(grads.num_tokens))
        self.trainer.apply_gradients()
        return self.trainer.result(groups, grads, start)

    def _push_step(
        self, groups: list[SampleGroup], weights: list[float] | None, start: float
    ) -> TrainResult:
        """A learner other than 0: gradient on the weights it holds, sent to learner 0."""
        t = self.trainer
        grads = t.compute_gradients(groups, weights)
        t.clip_gradients()
        send_versioned(self.ctx, _grads(self.params), t.version, 0)
        name = f"grad on v{t.version} (learner {self.ctx.rank})"
        span = Span("trainer", name, start, time.time(), {"groups": [g.group_id for g in groups]})
        return TrainResult(
            t.version, grads.staleness, grads.metrics, span, token_staleness=grads.token_staleness
        )

    def _serve_step(
        self, groups: list[SampleGroup], weights: list[float] | None, start: float
    ) -> TrainResult:
        """Learner 0 in async / staleness: its own gradient and one push from every other
        learner, applied in arrival order; then one new published version."""
        server, t = self._server, self.trainer
        assert server is not None  # built for async / staleness on learner 0
        inbox = VersionedInbox(self.ctx, self.params, range(1, self.ctx.world_size))
        base = server.version
        grads = t.compute_gradients(groups, weights)
        t.clip_gradients()
        pushes: list[tuple[int, int, float]] = []  # (learner, staleness, weight) in order
        for item in inbox.arrived():  # what arrived while this learner computed goes first
            self._apply(item, pushes)
        self._apply((0, base, [g.clone() for g in _grads(self.params)]), pushes)
        while len(pushes) < self.ctx.world_size:
            self._apply(inbox.get(), pushes)
        inbox.close()
        with torch.no_grad():  # the model mirrors the server, which learner 0 publishes
            for p, q in zip(self.params, server.params):
                p.copy_(q)
        t.finish_step()
        self._server_version_at[t.version] = server.version
        lags = [s for _, s, _ in pushes]
        grads.metrics.update(
            push_staleness_max=float(max(lags)),
            push_staleness_mean=sum(lags) / len(lags),
            push_weight_mean=sum(w for _, _, w in pushes) / len(pushes),
        )
        res = t.result(groups, grads, start)
        res.span.args["pushes"] = pushes
        return res

    def _apply(
        self, item: tuple[int, int, list[torch.Tensor]], pushes: list[tuple[int, int, float]]
    ) -> None:
        """One push: ``(learner, version, gradient)``; learner 0 gives a server version, the
        others the published version they computed on."""
        server = self._server
        assert server is not None  # learner 0 in async / staleness
        learner, version, grads = item
        base = version if learner == 0 else self._server_version_at[version]
        res = server.push(grads, base)
        pushes.append((learner, res.staleness, res.weight))


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
