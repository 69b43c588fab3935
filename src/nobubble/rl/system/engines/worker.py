"""Stage logic shared by the engines: build a stage from a RunConfig, answer its commands.

A :class:`StageWorker` is what runs inside a local process or a Ray actor. It is built from
the (picklable) :class:`~nobubble.rl.system.orchestrator.RunConfig` alone, so both engines start
identical workers; ``handle`` turns one command into the messages for the orchestrator.

Fault injection for tests: ``RunConfig.fault = "<worker>:<call>:<raise|exit>"`` makes that
worker raise (or exit the process without a word) on its ``call``-th command.
"""

from __future__ import annotations

import os
from typing import Any

import torch

from nobubble.rl.system.config import RunConfig
from nobubble.rl.system.protocol import Message
from nobubble.rl.system.reward import Rewarder
from nobubble.rl.system.rollout import RolloutWorker
from nobubble.rl.system.trainer import Trainer

__all__ = ["StageWorker", "InjectedFault"]


class InjectedFault(RuntimeError):
    """The failure a test asked for with ``RunConfig.fault``."""


class StageWorker:
    """One stage worker: ``rollout-<i>``, ``reward-<i>`` or ``trainer``."""

    def __init__(self, name: str, cfg: RunConfig, seed_offset: int = 0) -> None:
        self.name = name
        self.cfg = cfg
        self.task = cfg.make_task()
        self.calls = 0
        self.kind = name.split("-")[0]
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
            self.trainer = Trainer(
                task=self.task, model=cfg.build_policy(self.task), cfg=cfg.trainer_config()
            )
        elif self.kind == "reward":
            self.rewarder = Rewarder(
                self.task, cfg.rewards, cfg.reward_config(), remote=cfg.remote_reward()
            )
        else:
            raise ValueError(f"unknown worker {name!r}")

    def _maybe_fault(self) -> None:
        self.calls += 1
        if not self.cfg.fault:
            return
        who, call, how = self.cfg.fault.split(":")
        if who == self.name and int(call) == self.calls:
            if how == "exit":
                os._exit(3)
            raise InjectedFault(f"{self.name}: injected failure on call {self.calls}")

    def rollout_cmd(self, requests: list[Any]) -> list[Message]:
        self._maybe_fault()
        groups, span = self.rollout.generate(requests)
        return [Message("rollout", self.name, groups, (span,))]

    def reward_cmd(self, groups: list[Any]) -> list[Message]:
        self._maybe_fault()
        out, spans = [], []
        for g in groups:
            scored, span = self.rewarder.score_group(g)
            out.append(scored)
            spans.append(span)
        return [Message("reward", self.name, out, tuple(spans))]

    def train_cmd(self, groups: list[Any], weights: Any = None) -> Message:
        self._maybe_fault()
        res = self.trainer.train_step(groups)
        return Message("train", self.name, res, (res.span,), weights)

    def eval_cmd(self) -> Message:
        ev = self.trainer.evaluate()
        return Message("eval", self.name, ev, (ev.span,) if ev.span else ())

    def state_dict(self) -> dict[str, torch.Tensor]:
        return self.trainer.state_dict()
