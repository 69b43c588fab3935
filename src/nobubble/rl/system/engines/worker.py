"""Stage logic shared by the engines: build a stage from a RunConfig, answer its commands.

A :class:`StageWorker` is what runs inside a local process or a Ray actor. It is built from
the (picklable) :class:`~nobubble.rl.system.orchestrator.RunConfig` alone, so both engines start
identical workers; ``handle`` turns one command into the messages for the orchestrator.

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
from pathlib import Path
from typing import Any

import torch

from nobubble.rl.system.checkpoint import TRAINER_FILE, CheckpointStore, load_trainer, save_trainer
from nobubble.rl.system.config import RunConfig
from nobubble.rl.system.engines.learners import join_learner_group, learner_rank
from nobubble.rl.system.engines.protocol import Message
from nobubble.rl.system.rewards import Rewarder
from nobubble.rl.system.rollout import RolloutWorker
from nobubble.rl.system.trainer import GroupBatch, evaluate_policy, group_learner, train_result
from nobubble.rl.system.weight_sync import weight_digest

__all__ = ["StageWorker", "InjectedFault"]


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
        self._digest: tuple[int, str] | None = None  # (version, digest) of the trainer's model
        self.rank = learner_rank(name) if self.kind == "trainer" else 0
        if self.kind == "rollout":
            self.rollout = RolloutWorker(
                task=self.task,
                model=cfg.build_policy(self.task),
                cfg=cfg.rollout_config(),
                seed=cfg.seed,
                worker_id=int(name.split("-")[1]),
            )
        elif self.kind == "trainer":
            torch.manual_seed(cfg.seed)
            self.learner = group_learner(
                task=self.task, model=cfg.build_policy(self.task), cfg=cfg.trainer_config()
            )
            folder = cfg.checkpoint_dir
            ckpt = CheckpointStore(folder).latest() if cfg.resume and folder else None
            if ckpt is not None:
                t, ref = self.learner, self.learner.loss.reference
                t.version = load_trainer(ckpt / TRAINER_FILE, t.model, t.optimizer, ref)
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

    def rollout_cmd(self, requests: list[Any], rng_state: Any = None) -> list[Message]:
        self._maybe_fault()
        if rng_state is not None:
            self.rollout.generator.set_state(rng_state)
        groups, span = self.rollout.generate(requests)
        state = self.rollout.generator.get_state()
        return [Message("rollout", self.name, groups, (span,), state=state)]

    def reward_cmd(self, groups: list[Any]) -> list[Message]:
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

    def train_cmd(
        self, groups: list[Any], checkpoint: str | None = None, weights: list[float] | None = None
    ) -> Message:
        """One step (``weights``: per group, e.g. replay IS weights); with ``checkpoint`` (a
        folder), the trainer's checkpoint file too. A learner other than 0 trains its shard
        and answers ``shard``."""
        self._maybe_fault()
        before, start = self._trainer_digest(), time.time()
        shard = self.learner.update([GroupBatch(groups, weights)])
        res = train_result(self.learner, groups, shard, start)
        if self.rank > 0:
            return Message("shard", self.name, res, (res.span,))
        res = dataclasses.replace(res, weight_digests=dict([before, self._trainer_digest()]))
        if checkpoint is not None:
            t, ref = self.learner, self.learner.loss.reference
            save_trainer(Path(checkpoint) / TRAINER_FILE, t.model, t.optimizer, t.version, ref)
        return Message("train", self.name, res, (res.span,))

    def _trainer_digest(self) -> tuple[int, str]:
        """(version, digest) of the trainer's weights, hashed once per version."""
        version = self.learner.version
        if self._digest is None or self._digest[0] != version:
            self._digest = (version, weight_digest(self.learner.model))
        return self._digest

    def eval_cmd(self) -> Message:
        self.learner.model.eval()
        ev = evaluate_policy(self.learner.model, self.task, self.learner.version)
        return Message("eval", self.name, ev, (ev.span,) if ev.span else ())

    def state_dict(self) -> dict[str, torch.Tensor]:
        return self.learner.state_dict()
