"""What both engines share: the :class:`StageWorker` a process or actor runs (built from the
picklable ``RunConfig`` alone) and the driver's :class:`Engine`. ``RunConfig.learners = L``
makes the trainer stage ``trainer`` (learner 0) .. ``trainer-<L-1>``, one gloo group.

Fault injection for tests: ``RunConfig.fault = "<worker>:<call>:<raise|exit|kill|stale>"``
makes that worker raise, exit without a word, SIGKILL itself, or (a rollout worker) keep
sampling with the weights it holds while reporting new versions, on its ``call``-th
command - in its first incarnation only, so a restarted worker runs clean.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import time
from abc import ABC, abstractmethod
from collections import Counter, deque
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from nobubble.distributed import DistContext, WorkerError, default_backend
from nobubble.rl.system.checkpoint import CheckpointStore, load_trainer, save_trainer
from nobubble.rl.system.config import RunConfig
from nobubble.rl.system.learner import GroupBatch, TrainResult, group_learner
from nobubble.rl.system.rewards import Rewarder
from nobubble.rl.system.rollout import RolloutWorker, sample_responses
from nobubble.rl.system.types import GroupRequest, SampleGroup, Span
from nobubble.rl.system.weight_sync import WeightSource, cached_digest

__all__ = [
    "StageWorker",
    "InjectedFault",
    "Engine",
    "split_groups",
    "StepCollector",
    "Message",
    "EvalResult",
    "WorkerError",
]


class InjectedFault(RuntimeError):
    """The failure a test asked for with ``RunConfig.fault``."""


@dataclass(frozen=True)
class Message:
    """A stage's answer to the orchestrator."""

    kind: str  # ready | rollout | reward | train | shard | eval
    worker: str
    payload: Any = None  # groups (rollout, reward), a TrainResult, an EvalResult, the node (ready)
    spans: tuple[Span, ...] = ()  # busy spans for the timeline
    # learner 0's ready and train: the engine's handle to the published weights (or None)
    weights: Any = None
    state: Any = None  # rollout: the generator's RNG state after the call (for checkpoints)


@dataclass(frozen=True)
class EvalResult:
    """Greedy decoding over the task's evaluation prompts: the share solved, the mean reward."""

    version: int
    accuracy: float
    mean_reward: float
    span: Span = field(compare=False)


def learner_names(num_learners: int) -> list[str]:
    """``["trainer", "trainer-1", ...]``: learner 0 keeps the one-learner name."""
    return ["trainer", *(f"trainer-{r}" for r in range(1, num_learners))]


def learner_rank(name: str) -> int:
    """The rank of a learner named by :func:`learner_names`: ``trainer-2`` -> 2."""
    return int(name.partition("-")[2] or 0)


class StageWorker:
    """One stage worker: ``rollout-<i>``, ``reward-<i>``, ``trainer`` or ``trainer-<i>``."""

    def __init__(self, name: str, cfg: RunConfig, incarnation: int = 0) -> None:
        self.name = name
        self.cfg = cfg
        self.incarnation = incarnation
        self.task = cfg.make_task()
        self.calls = 0
        self.kind = name.split("-")[0]
        torch.set_num_threads(1 if self.kind == "reward" else cfg.threads)
        self._digests: dict[int, str] = {}  # version -> digest of the trainer's model
        self.rank = learner_rank(name) if self.kind == "trainer" else 0
        if self.kind == "rollout":
            model = cfg.build_policy(self.task)
            worker_id = int(name.split("-")[1])
            self.rollout = RolloutWorker(task=self.task, model=model, cfg=cfg, worker_id=worker_id)
        elif self.kind == "trainer":
            torch.manual_seed(cfg.seed)
            self.learner = group_learner(task=self.task, model=cfg.build_policy(self.task), cfg=cfg)
            folder = cfg.checkpoint_dir
            ckpt = CheckpointStore(folder).latest() if cfg.resume and folder else None
            if ckpt is not None:
                load_trainer(ckpt, self.learner)
        elif self.kind == "reward":
            self.rewarder = Rewarder(
                self.task, cfg.reward_sources(), cfg.reward_config(), remote=cfg.remote_reward()
            )
        else:
            raise ValueError(f"unknown worker {name!r}")

    def _maybe_fault(self) -> None:
        self.calls += 1
        if not self.cfg.fault or self.incarnation:
            return
        who, call, how = self.cfg.fault.split(":")
        if who == self.name and int(call) == self.calls:
            if how == "exit":
                os._exit(3)
            if how == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            if how == "stale":
                self.rollout.go_stale()
                return
            raise InjectedFault(f"{self.name}: injected failure on call {self.calls}")

    def ready(self, weights: WeightSource, node: Any = None) -> Message:
        """The ``ready`` message (``node``: where the worker runs, if the engine knows);
        learner 0 publishes its starting weights with it (a resumed trainer's checkpoint)."""
        lead = self.kind == "trainer" and self.rank == 0
        published = weights.publish(self.learner.model, self.learner.version) if lead else None
        return Message("ready", self.name, node, weights=published)

    def handle(self, cmd: tuple, weights: WeightSource) -> list[Message]:
        """Answer one :class:`Engine` command with the messages for the orchestrator;
        ``weights``: where this worker pulls the newest published weights from and learner 0
        publishes each new version."""
        op, *args = cmd
        if op not in ("rollout", "reward", "train", "eval"):
            raise ValueError(f"{self.name}: unknown command {op!r}")
        return getattr(self, f"_{op}")(weights, *args)

    def _rollout(
        self, weights: WeightSource, requests: list[GroupRequest], rng_state: Any = None
    ) -> list[Message]:
        self.rollout.pull = weights.pull  # between tokens too (partial rollouts)
        self.rollout.version = weights.pull(self.rollout.model, self.rollout.version)
        self._maybe_fault()
        if rng_state is not None:
            self.rollout.generator.set_state(rng_state)
        groups, span = self.rollout.generate(requests)
        state = self.rollout.generator.get_state()
        return [Message("rollout", self.name, groups, (span,), state=state)]

    def _reward(self, weights: WeightSource, groups: list[SampleGroup]) -> list[Message]:
        self._maybe_fault()
        scored = [self.rewarder.score_group(g) for g in groups]
        return [Message("reward", self.name, [g for g, _ in scored], tuple(s for _, s in scored))]

    def join_learners(self, host: str, port: int) -> None:
        """Join the learners' gloo group at ``host:port`` as this process's default group
        (``learners > 1``; blocks until all joined, at most ``stall_timeout_s``)."""
        cfg, backend = self.cfg, default_backend("cpu")
        rank, world, timeout_s = self.rank, cfg.learners, cfg.stall_timeout_s
        dist.init_process_group(
            backend,
            init_method=f"tcp://{host}:{port}",
            rank=rank,
            world_size=world,
            timeout=timedelta(seconds=timeout_s),
        )
        ctx = DistContext(rank, world, backend, torch.device("cpu"), rank, world, timeout_s)
        self.learner.join(ctx, cfg.aggregation, cfg.effective_local_sgd_every)

    def _train(
        self,
        weights: WeightSource,
        groups: list[SampleGroup],
        evaluate: bool,
        checkpoint: str | None = None,
        group_weights: list[float] | None = None,
    ) -> list[Message]:
        """One step (``group_weights``: per group, e.g. replay IS weights; ``checkpoint``: a
        folder for the trainer's file). A learner other than 0 answers ``shard``; learner 0
        publishes the new version and reports the digests of the one it started from and made."""
        learner = self.learner
        if learner.pushes_gradients:  # it computes on the newest published weights
            learner.version = weights.pull(learner.model, learner.version)
        self._maybe_fault()
        # learner 0 reports the digests (the others' results are merged into its)
        before = (
            cached_digest(self._digests, learner.model, learner.version) if self.rank == 0 else None
        )
        start = time.time()
        shard = learner.update([GroupBatch(groups, group_weights)])
        v, ids = learner.version, [g.group_id for g in groups]
        args: dict[str, Any] = {"groups": ids}
        if learner.pushes_gradients:  # the version it computed on
            name = f"grad on v{v} (learner {self.rank})"
        else:
            name, args["max_lag"] = f"train v{v - 1}->v{v}", max(shard.staleness)
            if shard.pushes:
                args["pushes"] = shard.pushes
        span = Span("trainer", name, start, time.time(), args)
        trained_by = {} if learner.ctx is None else dict.fromkeys(ids, self.rank)
        digests = (
            {} if before is None else dict([before, cached_digest(self._digests, learner.model, v)])
        )
        res = TrainResult(
            v, shard.staleness, shard.metrics, span, trained_by, shard.token_staleness, digests
        )
        if self.rank > 0:
            return [Message("shard", self.name, res, (span,))]
        if checkpoint is not None:
            save_trainer(checkpoint, learner)
        published = weights.publish(learner.model, learner.version)
        msg = Message("train", self.name, res, (span,), published)
        return [msg, *self._eval(weights)] if evaluate else [msg]

    @torch.no_grad()
    def _eval(self, weights: WeightSource) -> list[Message]:
        """Accuracy (``task.is_correct``) and mean reward of the learner's greedy responses
        on the task's evaluation set."""
        task, version, start = self.task, self.learner.version, time.time()
        prompts = task.eval_prompts
        _, responses = sample_responses(task, self.learner.model.eval(), prompts, greedy=True)
        correct = sum(task.is_correct(q, r) for q, r in zip(prompts, responses))
        reward = sum(task.reward(q, r) for q, r in zip(prompts, responses)) / len(prompts)
        span = Span("trainer", f"eval v{version}", start, time.time(), {"version": version})
        ev = EvalResult(version, correct / len(prompts), reward, span)
        return [Message("eval", self.name, ev, (span,))]


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
    cuts = [r * base + min(r, extra) for r in range(num_learners + 1)]
    return [
        (groups[a:b], None if weights is None else weights[a:b]) for a, b in zip(cuts, cuts[1:])
    ]


class StepCollector:
    """In the driver: merges the L learners' answers to one batch into one ``train`` message.

    Lifecycle of a batch: :meth:`expect` (the group ids of each shard) -> learner 0's
    ``train`` and the others' ``shard`` arrive -> released as learner 0's message with every
    learner's staleness (in batch order), ``trained_by`` and group-weighted mean metrics;
    learner 0's ``eval`` stays behind its ``train``. Invariant: a learner reporting other
    groups than it was sent is an error, so a released step proves who trained every group.
    """

    def __init__(self, num_learners: int) -> None:
        self.num_learners = num_learners
        self._expected: deque[list[list[int]]] = deque()
        self._reports: dict[str, deque[Message]] = {
            name: deque() for name in learner_names(num_learners)[1:]
        }
        self._held: deque[Message] = deque()

    def expect(self, shards: list[list[int]]) -> None:
        self._expected.append(shards)

    def feed(self, msgs: list[Message]) -> list[Message]:
        out = []
        for m in msgs:
            if m.kind == "shard":
                self._reports[m.worker].append(m)
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
                name = learner_names(self.num_learners)[rank]
                raise WorkerError(
                    f"{name} reported groups {sorted(res.trained_by)} for step "
                    f"{results[0].version}, was sent {ids}",
                    name,
                )
            trained_by.update(res.trained_by)
        sizes = [len(ids) for ids in expected]
        metrics = dict(results[0].metrics)
        for key in set.intersection(*(set(r.metrics) for r in results)):
            metrics[key] = sum(n * r.metrics[key] for n, r in zip(sizes, results)) / sum(sizes)
        staleness = [lag for r in results for lag in r.staleness]
        tokens = sum((Counter(r.token_staleness) for r in results), Counter())
        res = dataclasses.replace(
            results[0], staleness=staleness, metrics=metrics, trained_by=trained_by,
            token_staleness=dict(sorted(tokens.items())),
        )  # fmt: skip
        spans = (*msg.spans, *(s for r in reports for s in r.spans))
        return Message("train", msg.worker, res, spans, msg.weights, msg.state)


class Engine(ABC):
    """Where the stages run, the driver's side: every ``submit_*`` returns at once (a command
    :meth:`StageWorker.handle` answers), results come from :meth:`poll`; several learners'
    answers are merged (:class:`StepCollector`). Subclasses implement the ``_`` hooks and
    :meth:`shutdown`."""

    def __init__(self) -> None:
        self._cfg: RunConfig | None = None
        self._incarnation: dict[str, int] = {}
        self._collector: StepCollector | None = None  # learners > 1: merges their answers
        self._weights: Any = None  # the newest published handle (learner 0's), if any

    def start(self, cfg: RunConfig) -> list[str]:
        """Start every stage worker of ``cfg``; returns their names (each says ``ready``).
        A start that fails shuts down what it started."""
        self._cfg = cfg
        names = [f"rollout-{i}" for i in range(cfg.num_rollout_workers)]
        names += [f"reward-{i}" for i in range(cfg.num_reward_workers)]
        names += learner_names(cfg.learners)
        if cfg.learners > 1:
            self._collector = StepCollector(cfg.learners)
        try:
            self._start(cfg, names)
            for name in names:
                self._spawn(name)
            if cfg.learners > 1:
                self._join_learners(cfg)
        except BaseException:  # the orchestrator shuts down only an engine that started
            self.shutdown()
            raise
        return names

    def submit_rollout(
        self,
        worker: str,
        requests: list[GroupRequest],
        rng_state: Any = None,  # set the generator's RNG first (a resumed run)
    ) -> None:
        self._send(worker, ("rollout", requests, rng_state))

    def submit_reward(self, worker: str, groups: list[SampleGroup]) -> None:
        self._send(worker, ("reward", groups))

    def submit_train(
        self,
        groups: list[SampleGroup],
        evaluate: bool,
        checkpoint: str | None = None,  # a folder: the trainer writes its checkpoint file there
        weights: list[float] | None = None,  # per group (replay IS weights); None = all 1
    ) -> None:
        """One step; with several learners each gets a shard, and learner 0 evaluates and
        writes the checkpoint."""
        if self._collector is None:
            self._send("trainer", ("train", groups, evaluate, checkpoint, weights))
            return
        shards = split_groups(groups, weights, self._collector.num_learners)
        self._collector.expect([[g.group_id for g in shard] for shard, _ in shards])
        for rank, (name, (shard, w)) in enumerate(zip(learner_names(len(shards)), shards)):
            first = rank == 0
            self._send(name, ("train", shard, evaluate and first, checkpoint if first else None, w))

    def submit_eval(self) -> None:
        self._send("trainer", ("eval",))

    def restart(self, worker: str) -> None:
        """Stop ``worker`` if it still runs and start a fresh one of that name in its place;
        the new one says ``ready``. Commands queued for the old one are dropped."""
        if worker.startswith("trainer"):
            raise WorkerError(f"{worker} is not restarted; resume from a checkpoint", worker)
        self._stop(worker)
        self._spawn(worker)

    def _spawn(self, name: str) -> None:
        incarnation = self._incarnation.get(name, -1) + 1
        self._incarnation[name] = incarnation
        self._launch(name, incarnation)

    def poll(self, timeout_s: float) -> list[Message]:
        """Messages that arrived within ``timeout_s`` (all that are queued, once one is),
        learners' answers merged; raises a failed worker's :class:`WorkerError` when none."""
        out = self._receive(timeout_s)
        if self._collector is not None:
            out = self._collector.feed(out)
        for m in out:  # learner 0's ready, then each step: the newest published weights
            if m.weights is not None:
                self._weights = m.weights
        failure = None if out else self._failure()
        if failure is not None:
            raise failure
        return out

    def _join_learners(self, cfg: RunConfig) -> None:  # noqa: B027 - an optional hook
        """The learners meet in one group (the local engine's do it themselves)."""

    @abstractmethod
    def shutdown(self) -> None: ...

    @abstractmethod
    def _start(self, cfg: RunConfig, names: list[str]) -> None: ...

    @abstractmethod
    def _launch(self, name: str, incarnation: int) -> None: ...

    @abstractmethod
    def _send(self, worker: str, cmd: tuple) -> None: ...

    @abstractmethod
    def _stop(self, worker: str) -> None: ...

    @abstractmethod
    def _receive(self, timeout_s: float) -> list[Message]: ...

    @abstractmethod
    def _failure(self) -> WorkerError | None: ...
