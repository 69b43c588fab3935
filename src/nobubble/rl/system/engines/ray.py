"""The Ray engine: every stage worker is a Ray actor; data moves through the object store.

The same :class:`~nobubble.rl.system.engines.worker.StageWorker` as the local engine runs inside
each actor (OpenRLHF's layout: rollout, reward and trainer actors). Groups go from actor to
actor as object references; after each step the trainer puts its state dict in the object
store and returns the reference, which the orchestrator hands to the rollout actors with
their next chunk (Ray resolves it there), so weights never pass through the driver.

By default a local Ray instance is started (``num_cpus`` = this machine's cores, no
dashboard); ``RunConfig.ray_address`` joins an existing cluster instead. Ray is imported
only here. An actor that raises, or dies, ends the run with a :class:`WorkerError`.
"""

from __future__ import annotations

import os
from typing import Any

from nobubble.rl.system.config import RunConfig
from nobubble.rl.system.protocol import Message, WorkerError

__all__ = ["RayEngine"]


class _StageActor:
    """Actor body: a StageWorker plus the Ray plumbing for weights."""

    def __init__(self, name: str, cfg: RunConfig, threads: int, incarnation: int) -> None:
        import torch

        torch.set_num_threads(threads)
        from nobubble.rl.system.engines.worker import StageWorker

        self.worker = StageWorker(name, cfg, incarnation)

    def ready(self) -> list[Message]:
        return [Message("ready", self.worker.name)]

    def initial_weights(self) -> dict:
        return self.worker.state_dict()

    def version(self) -> int:
        return self.worker.trainer.version

    def rollout(
        self, requests: list, version: int, state_dict: dict, rng_state: Any = None
    ) -> list[Message]:
        self.worker.rollout.set_weights(version, state_dict)
        return self.worker.rollout_cmd(requests, rng_state)

    def reward(self, groups: list) -> list[Message]:
        return self.worker.reward_cmd(groups)

    def train(
        self, groups: list, evaluate: bool, checkpoint: str | None, weights: list[float] | None
    ) -> list[Message]:
        import ray

        msg = self.worker.train_cmd(groups, checkpoint, weights)
        ref = ray.put(self.worker.state_dict())
        msg = Message(msg.kind, msg.worker, msg.payload, msg.spans, (msg.payload.version, [ref]))
        return [msg, self.worker.eval_cmd()] if evaluate else [msg]

    def evaluate(self) -> list[Message]:
        return [self.worker.eval_cmd()]


class RayEngine:
    """Stage workers as Ray actors (see the module docstring)."""

    def __init__(self) -> None:
        self._actors: dict[str, Any] = {}
        self._pending: dict[Any, str] = {}
        self._started_ray = False
        self._weights: tuple[int, Any] | None = None
        self._cfg: RunConfig | None = None
        self._incarnation: dict[str, int] = {}
        self._errors: list[WorkerError] = []

    def start(self, cfg: RunConfig) -> list[str]:
        import ray

        if not ray.is_initialized():
            if cfg.ray_address:
                ray.init(address=cfg.ray_address, log_to_driver=False)
            else:
                ray.init(
                    num_cpus=os.cpu_count() or 2,
                    include_dashboard=False,
                    log_to_driver=False,
                )
            self._started_ray = True
        self._cfg = cfg
        names = [f"rollout-{i}" for i in range(cfg.num_rollout_workers)]
        names += [f"reward-{i}" for i in range(cfg.num_reward_workers)]
        names.append("trainer")
        for name in names:
            self._spawn(name)
        trainer = self._actors["trainer"]
        try:  # a resumed trainer starts at its checkpoint's version
            version = ray.get(trainer.version.remote(), timeout=cfg.stall_timeout_s)
        except Exception as err:  # RayActorError, GetTimeoutError
            msg = f"trainer failed to start: {type(err).__name__}: {err}"
            raise WorkerError(msg, "trainer") from err
        self._weights = (version, trainer.initial_weights.remote())
        return names

    def _spawn(self, name: str) -> None:
        import ray

        assert self._cfg is not None  # set by start()
        incarnation = self._incarnation.get(name, -1) + 1
        self._incarnation[name] = incarnation
        # reward workers mostly wait on verifiers: they take no CPU slot of their own
        cpus = 0 if name.startswith("reward") else 1
        opts = {"num_cpus": cpus, "max_restarts": 0, "name": None}
        # Any: Ray's actor-proxy types do not give undecorated methods a ``.remote``
        actor: Any = (
            ray.remote(_StageActor)
            .options(**opts)
            .remote(name, self._cfg, self._cfg.torch_threads(), incarnation)
        )
        self._actors[name] = actor
        self._pending[actor.ready.remote()] = name

    def restart(self, worker: str) -> None:
        """Kill ``worker``'s actor, forget its pending calls, start a fresh actor."""
        import ray

        if worker == "trainer":
            raise WorkerError("the trainer is not restarted; resume from a checkpoint", worker)
        try:
            ray.kill(self._actors.pop(worker))
        except Exception:  # noqa: BLE001 - an actor that already died is fine
            pass
        self._pending = {r: w for r, w in self._pending.items() if w != worker}
        self._spawn(worker)

    def _submit(self, worker: str, ref: Any) -> None:
        self._pending[ref] = worker

    def submit_rollout(
        self, worker: str, requests: list, weights: Any, rng_state: Any = None
    ) -> None:
        if weights is not None:
            version, (ref,) = weights
            self._weights = (version, ref)
        assert self._weights is not None  # set by start()
        version, ref = self._weights
        actor = self._actors[worker]
        self._submit(worker, actor.rollout.remote(requests, version, ref, rng_state))

    def submit_reward(self, worker: str, groups: list) -> None:
        self._submit(worker, self._actors[worker].reward.remote(groups))

    def submit_train(
        self,
        groups: list,
        evaluate: bool,
        checkpoint: str | None = None,
        weights: list[float] | None = None,
    ) -> None:
        trainer = self._actors["trainer"]
        self._submit("trainer", trainer.train.remote(groups, evaluate, checkpoint, weights))

    def submit_eval(self) -> None:
        self._submit("trainer", self._actors["trainer"].evaluate.remote())

    def poll(self, timeout_s: float) -> list[Message]:
        import ray

        if self._errors:  # held back from the last call, which returned other results
            raise self._errors.pop(0)
        if not self._pending:
            return []
        refs = list(self._pending)
        done, _ = ray.wait(refs, num_returns=1, timeout=timeout_s)
        if done:
            more, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
            done = list(dict.fromkeys([*done, *more]))
        out: list[Message] = []
        for ref in done:
            name = self._pending.pop(ref)
            try:
                out.extend(ray.get(ref, timeout=60))
            except Exception as err:  # RayTaskError, RayActorError, GetTimeoutError
                error = WorkerError(f"{name} failed: {type(err).__name__}: {err}", name)
                error.__cause__ = err
                self._errors.append(error)
        if not out and self._errors:
            raise self._errors.pop(0)
        return out

    def shutdown(self) -> None:
        import ray

        for actor in self._actors.values():
            try:
                ray.kill(actor)
            except Exception:  # noqa: BLE001 - an actor that already died is fine
                pass
        self._actors.clear()
        self._pending.clear()
        if self._started_ray:
            ray.shutdown()
