"""The actor processes of one run and their channels to the learner, per architecture
(``docs/rl/actor-learner.md``): impala actors pull weights from
:class:`~nobubble.rl.system.weight_sync.SharedWeights` and put trajectories on one bounded
queue; seed / sample-factory workers trade observations for actions with central inference
through :class:`EnvSlot` s. Every actor runs under :func:`nobubble.distributed.supervised`.
"""

from __future__ import annotations

import copy
import multiprocessing as mp
import queue as queue_module
import time
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import wait
from typing import Any, cast

import numpy as np
import torch
from torch import nn

from nobubble.distributed import LIVENESS_S, Supervisor, Ward, WorkerError, reap, supervised
from nobubble.rl.actor_learner.config import EnvRunConfig, envs_per_trajectory
from nobubble.rl.actor_learner.model import (
    PolicyModel,
    Trajectory,
    TrajectoryBuilder,
    act,
    rollout,
    vector_env,
)
from nobubble.rl.system.weight_sync import SharedWeights, weight_digest

__all__ = ["ActorPool", "ActorSpec", "EnvSlot", "run_actor"]


_POLL_S = 0.2  # how often a worker waiting for actions looks at the stop flag
# array typecodes (numpy reads them too): float32, float32, int8, int64
_SLOT_TYPES = {"obs": "f", "reward": "f", "done": "b", "action": "q"}


class EnvSlot:
    """Shared memory of one env group of ``K`` envs (``slot[name]``: a numpy view), made by the
    parent: ``obs (K, D)`` float32, ``reward (K,)`` float32, ``done (K,)`` int8 written by the
    worker, which then sends the group's byte; ``action (K,)`` int64 written by central
    inference, which sends the byte back. Each side writes only after the other's byte: no lock."""

    def __init__(self, mp_context: Any, num_envs: int, obs_dim: int) -> None:
        self.num_envs, self.obs_dim = num_envs, obs_dim
        self._raw = {
            k: mp_context.RawArray(code, num_envs * (obs_dim if k == "obs" else 1))
            for k, code in _SLOT_TYPES.items()
        }
        self._views: dict[str, np.ndarray] = {}  # made once per process (inference reads
        # every slot at every step); not pickled: a spawned worker makes its own

    def __getitem__(self, name: str) -> np.ndarray:
        view = self._views.get(name)
        if view is None:
            view = np.frombuffer(self._raw[name], dtype=_SLOT_TYPES[name])
            if name == "obs":
                view = view.reshape(self.num_envs, self.obs_dim)
            self._views[name] = view
        return view

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_views": {}}


@dataclass(frozen=True)
class ActorSpec:
    """What an actor process needs to know about itself (``ward``: its supervisor handle)."""

    name: str
    index: int
    config: EnvRunConfig
    ward: Ward


def run_actor(spec: ActorSpec, channel: tuple[Any, ...], stop: Any, errors: Any) -> None:
    """Process entry: the actor loop of ``spec.config.arch`` under :func:`supervised`, until
    ``stop`` is set. ``channel``: impala ``(SharedWeights, trajectory queue, model)``, else
    ``(slots, pipe end)``; ``errors``: the queue its report goes to."""

    def report(text: str) -> None:
        errors.put((spec.name, text))
        errors.close()
        errors.join_thread()  # delivered before the process exits

    loop: Callable[..., None] = _impala_loop if spec.config.arch == "impala" else _worker_loop
    supervised(spec.ward, report, loop, spec, *channel, stop)


def _impala_loop(spec: ActorSpec, weights: Any, queue: Any, model: PolicyModel, stop: Any) -> None:
    """Roll out with this process's copy of ``model``, pulled before each unroll, into ``queue``."""
    # spawn/forkserver hand ``model`` over in shared memory: a pull must not write the learner's
    model = copy.deepcopy(model)
    torch.set_num_threads(spec.config.threads)
    c = spec.config
    generator = torch.Generator().manual_seed(c.seed * 1000 + spec.index)
    envs = vector_env(c.env, c.envs_per_actor, c.env_step_delay_ms)
    builder = TrajectoryBuilder(spec.name, c.unroll_length)
    obs, _ = envs.reset(seed=c.seed * 1000 + 100 * spec.index)  # (K, D)
    builder.observe(obs)
    version, digest = -1, ""  # the pool published version 0 before it started the actors
    while not stop.is_set():
        pulled = weights.pull(model, version, timeout_s=c.stall_timeout_s)
        if pulled != version:  # hash the weights this actor holds, once per version
            version, digest = pulled, weight_digest(model)
        trajectory, obs = rollout(
            model, envs, builder, obs, version=version, generator=generator, digest=digest
        )
        try:  # the bound is the backpressure; the pool drains the queue while it closes
            queue.put(trajectory, timeout=c.stall_timeout_s)
        except queue_module.Full:
            what = "the learner to take a trajectory"
            raise TimeoutError(f"{spec.name}: waited {c.stall_timeout_s}s for {what}") from None


def _worker_loop(spec: ActorSpec, slots: list[EnvSlot], conn: Any, stop: Any) -> None:
    """Step the env groups of ``slots``, exchanging observations and actions through them."""
    c = spec.config
    groups = [vector_env(c.env, slots[0].num_envs, c.env_step_delay_ms) for _ in slots]
    for g, (envs, slot) in enumerate(zip(groups, slots)):
        seed = c.seed * 1000 + 100 * spec.index + 10 * g
        slot["obs"][:] = envs.reset(seed=seed)[0]  # reward and done start at 0
        conn.send_bytes(bytes([g]))
    while not stop.is_set():
        for g, (envs, slot) in enumerate(zip(groups, slots)):
            deadline = time.monotonic() + c.stall_timeout_s
            while not conn.poll(_POLL_S):
                if stop.is_set():
                    return
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{spec.name}: waited {c.stall_timeout_s}s for actions")
            answered = conn.recv_bytes()[0]
            assert answered == g, f"{spec.name}: actions for group {answered}, expected {g}"
            obs, rewards, terminated, truncated, _ = envs.step(slot["action"].copy())
            slot["obs"][:], slot["reward"][:] = obs, rewards
            slot["done"][:] = terminated | truncated
            conn.send_bytes(bytes([g]))


class ActorPool:
    """Starts ``config.actors`` actor processes for ``config.arch`` that act with ``model`` as
    version 0; ``liveness_s``: silence after which :meth:`supervise` names an actor (None: never).
    Lifecycle: built (processes started) -> :meth:`receive` / :meth:`supervise` while the
    learner runs -> :meth:`close`. Invariant: after :meth:`close` no actor process is alive
    and every trajectory an actor sent was returned by :meth:`receive` or :meth:`close`."""

    def __init__(
        self, config: EnvRunConfig, model: PolicyModel, liveness_s: float | None = LIVENESS_S
    ) -> None:
        self.config, self.model = config, model
        self._module = cast(nn.Module, model)  # every PolicyModel is an nn.Module
        ctx: Any = mp.get_context(config.start_method)
        self.stop, self.errors = ctx.Event(), ctx.Queue()
        self.names = [f"actor-{i}" for i in range(config.actors)]
        self.supervisor = Supervisor(ctx, self.names, liveness_s)
        self.weights: SharedWeights | None = None
        self.inference_busy_s = 0.0  # central inference's time in forward passes
        if config.arch == "impala":
            self.weights = SharedWeights(self._module, ctx)
            self.queue = ctx.Queue(maxsize=2 * config.actors)
            channels: list[tuple[Any, ...]] = [(self.weights, self.queue, model)] * config.actors
            self.publish(0)
        else:
            groups = 2 if config.arch == "sample-factory" else 1
            per_group = envs_per_trajectory(config)
            self.slots = [
                [EnvSlot(ctx, per_group, model.obs_dim) for _ in range(groups)] for _ in self.names
            ]  # slots[a][g]: worker a's env group g
            pipes = [ctx.Pipe(duplex=True) for _ in self.names]
            self.conns = [p[0] for p in pipes]  # the learner's ends
            self.builders = {  # (a, g): worker a's env group g
                (a, g): TrajectoryBuilder(f"{name}/group-{g}", config.unroll_length)
                for a, name in enumerate(self.names)
                for g in range(groups)
            }
            self._generator = torch.Generator().manual_seed(config.seed + 7)
            channels = [(s, p[1]) for s, p in zip(self.slots, pipes)]
        for i, (name, channel) in enumerate(zip(self.names, channels)):
            spec = ActorSpec(name, i, config, self.supervisor.ward(name))
            args = (spec, channel, self.stop, self.errors)
            proc = ctx.Process(target=run_actor, args=args, name=name, daemon=True)
            proc.start()
            self.supervisor.procs[name] = proc

    @property
    def procs(self) -> list[Any]:
        """The actor processes, in :attr:`names`' order (the supervisor's, held once)."""
        return list(self.supervisor.procs.values())

    def publish(self, version: int) -> None:
        """impala: hand the learner's weights to the actors as ``version`` (no-op otherwise)."""
        if self.weights is not None:
            self.weights.publish(self._module, version, timeout_s=self.config.stall_timeout_s)

    def receive(self, version: int, digest: str = "", poll_s: float = 0.1) -> list[Trajectory]:
        """Finished trajectories (possibly none) after waiting at most about ``poll_s``;
        ``digest``: the learner's published digest of ``version`` (central inference acts with
        the learner's own model)."""
        if self.weights is None:
            try:
                return self._infer(version, digest, poll_s)
            except WorkerError:  # a pipe closed: its process ended; find its own report
                wait([p.sentinel for p in self.procs], timeout=self.config.stall_timeout_s)
                self.supervise()
                raise
        return _drain(self.queue, poll_s)

    def _requests(self, timeout_s: float) -> list[tuple[int, int]]:
        """``(actor, group)`` of each env group whose observations came within ``timeout_s``."""
        ready: list[tuple[int, int]] = []
        readable: list[Any] = wait(self.conns, timeout=timeout_s)
        for conn in readable:
            a = self.conns.index(conn)
            try:
                while conn.poll():
                    ready.append((a, conn.recv_bytes()[0]))
            except (EOFError, OSError):
                raise WorkerError(
                    f"{self.names[a]} closed its pipe (its process ended)", self.names[a]
                ) from None
        return ready

    def _infer(self, version: int, digest: str, poll_s: float) -> list[Trajectory]:
        """Wait at most ``poll_s`` for an env group's request, collect more until one per
        actor is in or ``inference_deadline_ms`` passed, answer them all with one forward
        pass of policy ``version`` (digest ``digest``); the trajectories finished. Raises
        :class:`WorkerError` when a worker's pipe closed."""
        ready = self._requests(poll_s)
        deadline = time.monotonic() + self.config.inference_deadline_ms / 1000.0
        while ready and len({a for a, _ in ready}) < len(self.conns):
            more = self._requests(max(0.0, deadline - time.monotonic()))
            if not more:
                break
            ready += more
        if not ready:
            return []
        start = time.perf_counter()
        finished: list[Trajectory] = []
        observations = []
        for a, g in ready:
            slot = self.slots[a][g]
            obs = slot["obs"].copy()  # (K, D)
            trajectory = self.builders[a, g].observe(obs, slot["reward"].copy(), slot["done"] > 0)
            if trajectory is not None:
                finished.append(trajectory)
            observations.append(obs)
        actions, logits = act(self.model, np.concatenate(observations), self._generator)
        offset = 0
        for a, g in ready:
            rows = slice(offset, offset + self.slots[a][g].num_envs)
            self.slots[a][g]["action"][:] = actions[rows]
            self.builders[a, g].record(actions[rows], logits[rows], version, digest)
            offset = rows.stop
            self.conns[a].send_bytes(bytes([g]))
        self.inference_busy_s += time.perf_counter() - start
        return finished

    def supervise(self) -> None:
        """Raise :class:`~nobubble.distributed.WorkerError` naming an actor that reported an
        error, exited, or fell silent."""
        self.supervisor.check(self._reports(0.0), self._reports)

    def _reports(self, timeout_s: float) -> dict[str, str]:
        """The actors' error reports that arrived within ``timeout_s`` (each actor's first)."""
        reports: dict[str, str] = {}
        for name, text in _drain(self.errors, timeout_s):
            reports.setdefault(name, text)
        return reports

    def close(self, grace_s: float = 5.0) -> list[Trajectory]:
        """Stop every actor (stop flag, drain the queue, then :func:`reap`: SIGTERM, SIGKILL
        for a stopped actor or a straggler); return the trajectories still in transit."""
        self.stop.set()
        leftover: list[Trajectory] = []
        deadline = time.monotonic() + grace_s
        waited = [p for p in self.procs if p.name not in self.supervisor.failed]
        while any(p.is_alive() for p in waited) and time.monotonic() < deadline:
            if self.weights is not None:  # a full queue would keep its feeder from exiting
                leftover.extend(self.receive(-1, poll_s=0.05))
            else:
                time.sleep(0.02)
        reap(self.procs, grace_s=0.1)  # a stopped actor (SIGSTOP) is killed at once
        if self.weights is not None:
            leftover.extend(self.receive(-1, poll_s=0.05))
        return leftover


def _drain(queue: Any, timeout_s: float) -> list[Any]:
    """What ``queue`` holds after waiting at most ``timeout_s`` for its first item."""
    items: list[Any] = []
    try:
        items.append(queue.get(timeout=timeout_s))
        while True:
            items.append(queue.get_nowait())
    except queue_module.Empty:
        pass
    return items
