"""What both engines share: the stage worker inside a process or actor, and the driver's side.

A :class:`StageWorker` is what runs inside a local process or a Ray actor. It is built from
the (picklable) :class:`~nobubble.rl.system.orchestrator.RunConfig` alone, so both engines start
identical workers; :meth:`StageWorker.handle` turns one command into the messages for the
orchestrator. :class:`Engine` is the driver's side of both engines: it names the workers,
turns every ``submit_*`` into a command and splits a batch among the learners; an engine
adds how a worker starts, gets a command, stops, and how its answers come back.

The trainer stage holds the one :class:`~nobubble.rl.system.learner.Learner`. With
``RunConfig.learners > 1`` it is several workers (``trainer``, ``trainer-1`` ..); after
:meth:`StageWorker.join_learners` each trains its shard, and the ones other than learner 0
answer ``shard`` messages (see :mod:`~nobubble.rl.system.engines.learners`).

Fault injection for tests: ``RunConfig.fault = "<worker>:<call>:<raise|exit|kill|stale>"``
makes that worker raise, exit the process without a word, SIGKILL itself, or (a rollout
worker) keep sampling with the weights it holds while reporting the new versions, on its
``call``-th command - in its first incarnation only, so a restarted worker runs clean.

A trainer's ``train`` message carries the digests of the version it started from and of the
one it made (``TrainResult.weight_digests``), for the orchestrator's
:class:`~nobubble.rl.system.weight_sync.PublishedWeights`.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import time
from collections.abc import Callable
from typing import Any

import torch

from nobubble.rl.system.checkpoint import CheckpointStore, load_trainer, save_trainer
from nobubble.rl.system.config import RunConfig
from nobubble.rl.system.engines.learners import (
    StepCollector,
    join_learner_group,
    learner_names,
    learner_rank,
    split_groups,
)
from nobubble.rl.system.engines.protocol import Message, WorkerError
from nobubble.rl.system.rewards import Rewarder
from nobubble.rl.system.rollout import RolloutWorker
from nobubble.rl.system.trainer import GroupBatch, evaluate_policy, group_learner, train_result
from nobubble.rl.system.types import GroupRequest, SampleGroup
from nobubble.rl.system.weight_sync import WeightSource, weight_digest

__all__ = ["StageWorker", "InjectedFault", "Engine"]


class InjectedFault(RuntimeError):
    """The failure a test asked for with ``RunConfig.fault``."""


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
        self._digest: tuple[int, str] | None = None  # (version, digest) of the trainer's model
        self.rank = learner_rank(name) if self.kind == "trainer" else 0
        if self.kind == "rollout":
            self.rollout = RolloutWorker(
                task=self.task,
                model=cfg.build_policy(self.task),
                cfg=cfg,
                worker_id=int(name.split("-")[1]),
            )
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
        published = None
        if self.kind == "trainer" and self.rank == 0:
            published = weights.publish(self.learner.model, self.learner.version)
        return Message("ready", self.name, node, weights=published)

    def handle(self, cmd: tuple, weights: WeightSource) -> list[Message]:
        """Answer one :class:`Engine` command with the messages for the orchestrator.

        ``weights``: where this worker pulls the newest published weights from (a generator
        before each request, a learner that pushes gradients before each step) and where
        learner 0 publishes each new version (the local engine's shared tensor, or the
        object store of a Ray call); the ``train`` message carries the engine's handle."""
        op, *args = cmd
        answers: dict[str, Callable[..., list[Message]]] = {
            "rollout": self._rollout,
            "reward": self._reward,
            "train": self._train,
            "eval": self._eval,
        }
        answer = answers.get(op)
        if answer is None:
            raise ValueError(f"{self.name}: unknown command {op!r}")
        return answer(weights, *args)

    def _rollout(
        self, weights: WeightSource, requests: list[GroupRequest], rng_state: Any = None
    ) -> list[Message]:
        self.rollout.version = weights.pull(self.rollout.model, self.rollout.version)
        self._maybe_fault()
        if rng_state is not None:
            self.rollout.generator.set_state(rng_state)
        groups, span = self.rollout.generate(requests)
        state = self.rollout.generator.get_state()
        return [Message("rollout", self.name, groups, (span,), state=state)]

    def _reward(self, weights: WeightSource, groups: list[SampleGroup]) -> list[Message]:
        self._maybe_fault()
        out, spans = [], []
        for g in groups:
            scored, span = self.rewarder.score_group(g)
            out.append(scored)
            spans.append(span)
        return [Message("reward", self.name, out, tuple(spans))]

    def join_learners(self, host: str, port: int) -> None:
        """Join the other learners' group at ``host:port`` (``learners > 1``; blocks until
        all joined, at most ``stall_timeout_s``)."""
        cfg = self.cfg
        ctx = join_learner_group(self.rank, cfg.learners, host, port, cfg.stall_timeout_s)
        self.learner.join(ctx, cfg.aggregation, cfg.effective_local_sgd_every)

    def _train(
        self,
        weights: WeightSource,
        groups: list[SampleGroup],
        evaluate: bool,
        checkpoint: str | None = None,
        group_weights: list[float] | None = None,
    ) -> list[Message]:
        """One step (``group_weights``: per group, e.g. replay IS weights); with
        ``checkpoint`` (a folder), the trainer's checkpoint file too. A learner other than 0
        trains its shard and answers ``shard``; learner 0 publishes the new version."""
        learner = self.learner
        if learner.pushes_gradients:  # it computes on the newest published weights
            learner.version = weights.pull(learner.model, learner.version)
        self._maybe_fault()
        before, start = self._trainer_digest(), time.time()
        shard = learner.update([GroupBatch(groups, group_weights)])
        res = train_result(learner, groups, shard, start)
        if self.rank > 0:
            return [Message("shard", self.name, res, (res.span,))]
        res = dataclasses.replace(res, weight_digests=dict([before, self._trainer_digest()]))
        if checkpoint is not None:
            save_trainer(checkpoint, learner)
        published = weights.publish(learner.model, learner.version)
        msg = Message("train", self.name, res, (res.span,), published)
        return [msg, *self._eval(weights)] if evaluate else [msg]

    def _trainer_digest(self) -> tuple[int, str]:
        """(version, digest) of the trainer's weights, hashed once per version."""
        version = self.learner.version
        if self._digest is None or self._digest[0] != version:
            self._digest = (version, weight_digest(self.learner.model))
        return self._digest

    def _eval(self, weights: WeightSource) -> list[Message]:
        self.learner.model.eval()
        ev = evaluate_policy(self.learner.model, self.task, self.learner.version)
        return [Message("eval", self.name, ev, (ev.span,) if ev.span else ())]


class Engine:
    """Where the stages run: the driver's side of an engine (see the module docstring).

    Every ``submit_*`` returns at once; results come from :meth:`poll`. A command is a tuple
    :meth:`StageWorker.handle` answers: ``("rollout", requests, rng_state)``, ``("reward",
    groups)``, ``("train", groups, evaluate, checkpoint, weights)`` or ``("eval",)``. An
    engine implements :meth:`_start` (start ``names`` with :meth:`_spawn`), :meth:`_launch`
    (one worker), :meth:`_send` (one command), :meth:`_stop` (one worker), :meth:`poll`
    and :meth:`shutdown`.
    """

    def __init__(self) -> None:
        self._cfg: RunConfig | None = None
        self._incarnation: dict[str, int] = {}
        self._collector: StepCollector | None = None  # learners > 1: merges their answers

    def start(self, cfg: RunConfig) -> list[str]:
        """Start every stage worker of ``cfg``; returns their names (each says ``ready``)."""
        self._cfg = cfg
        names = [f"rollout-{i}" for i in range(cfg.num_rollout_workers)]
        names += [f"reward-{i}" for i in range(cfg.num_reward_workers)]
        names += learner_names(cfg.learners)
        if cfg.learners > 1:
            self._collector = StepCollector(cfg.learners)
        self._start(cfg, names)
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

    def poll(self, timeout_s: float) -> list[Message]:  # raises WorkerError
        raise NotImplementedError

    def shutdown(self) -> None:
        raise NotImplementedError

    def _start(self, cfg: RunConfig, names: list[str]) -> None:
        raise NotImplementedError

    def _launch(self, name: str, incarnation: int) -> None:
        raise NotImplementedError

    def _send(self, worker: str, cmd: tuple) -> None:
        raise NotImplementedError

    def _stop(self, worker: str) -> None:
        raise NotImplementedError
