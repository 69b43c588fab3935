"""The actor processes: an IMPALA actor with its own policy, an env-only worker for central
inference (seed: one env group, sample-factory: two, double buffered).

Every actor runs under the one supervisor's guard (:func:`nobubble.distributed.supervised`):
it dies with its parent, beats into its heartbeat slot (so a stopped one is named), waits on
nothing without a timeout, and on any error puts ``(name, report)`` on the error queue before
exiting 1, so the learner can end the run naming it.

The env-only worker's protocol, per env group ``g`` with shared-memory slot ``slots[g]``:
the worker writes ``obs``, ``reward`` and ``done`` into the slot and sends the byte ``g``;
the learner reads them, writes ``action`` and sends ``g`` back. With two groups the worker
steps group 1 while the learner runs inference for group 0, and vice versa.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from nobubble.distributed import Ward, supervised
from nobubble.rl.actor_learner.config import EnvRunConfig
from nobubble.rl.actor_learner.envs import VectorEnv
from nobubble.rl.actor_learner.shm import EnvSlot

__all__ = ["ActorSpec", "ActorStopped", "impala_actor", "env_worker"]

_POLL_S = 0.2  # how often a blocked actor looks at the stop flag


class ActorStopped(Exception):
    """The learner asked this actor to stop while it waited."""


@dataclass(frozen=True)
class ActorSpec:
    """What an actor process needs to know about itself; ``ward`` is its handle from the
    pool's :class:`~nobubble.distributed.Supervisor`."""

    name: str
    index: int
    config: EnvRunConfig
    obs_dim: int
    num_actions: int
    ward: Ward


def _guard(spec: ActorSpec, errors: Any, body: Any, *args: Any) -> None:
    """Run ``body`` in a child process under :func:`supervised`; a stop request ends it."""

    def report(text: str) -> None:
        errors.put((spec.name, text))
        errors.close()
        errors.join_thread()  # delivered before the process exits

    def until_stopped() -> None:
        try:
            body(spec, *args)
        except ActorStopped:
            pass

    supervised(spec.ward, report, until_stopped)


def _wait(stop: Any, ready: Any, timeout_s: float, what: str, name: str) -> None:
    """Poll ``ready()`` until true; stop or time out (naming ``what``) otherwise."""
    deadline = time.monotonic() + timeout_s
    while not ready():
        if stop.is_set():
            raise ActorStopped
        if time.monotonic() > deadline:
            raise TimeoutError(f"{name}: waited {timeout_s}s for {what}")
        time.sleep(1e-3)  # ready() may not block: do not spin a core


def impala_actor(spec: ActorSpec, weights: Any, queue: Any, stop: Any, errors: Any) -> None:
    """Process entry: roll out with a local policy copy, stream trajectories to ``queue``."""
    _guard(spec, errors, _impala_loop, weights, queue, stop)


def _impala_loop(spec: ActorSpec, weights: Any, queue: Any, stop: Any) -> None:
    import torch

    from nobubble.rl.actor_learner.model import build_model
    from nobubble.rl.actor_learner.rollout import rollout
    from nobubble.rl.actor_learner.trajectory import TrajectoryBuilder
    from nobubble.rl.system.weight_sync import weight_digest

    torch.set_num_threads(spec.config.threads)
    c = spec.config
    model = build_model(c, spec.obs_dim, spec.num_actions)
    generator = torch.Generator().manual_seed(c.seed * 1000 + spec.index)
    envs = VectorEnv(c.env, c.envs_per_actor, c.seed * 1000 + 100 * spec.index, c.env_step_delay_ms)
    builder = TrajectoryBuilder(
        spec.name, c.unroll_length, c.envs_per_actor, spec.obs_dim, spec.num_actions
    )
    obs = envs.reset()  # (K, D)
    builder.observe(obs)
    version = -1
    _wait(stop, lambda: weights.version >= 0, c.stall_timeout_s, "the first weights", spec.name)
    digest = (-1, "")
    while not stop.is_set():
        version = weights.pull(model, version, timeout_s=c.stall_timeout_s)
        if digest[0] != version:  # hash the weights this actor holds, once per version
            digest = (version, weight_digest(model))
        trajectory, obs = rollout(
            model, envs, builder, obs, version=version, generator=generator, digest=digest[1]
        )
        _put(queue, trajectory, stop, c.stall_timeout_s, spec.name)


def _put(queue: Any, item: Any, stop: Any, timeout_s: float, name: str) -> None:
    """Put ``item`` on the bounded ``queue`` (:func:`_wait`: stop or time out meanwhile)."""
    import queue as queue_module

    def put() -> bool:
        try:
            queue.put(item, timeout=_POLL_S)
            return True
        except queue_module.Full:
            return False

    _wait(stop, put, timeout_s, "the learner to take a trajectory", name)


def env_worker(spec: ActorSpec, slots: list[EnvSlot], conn: Any, stop: Any, errors: Any) -> None:
    """Process entry: step env groups, exchange observations and actions through ``slots``."""
    _guard(spec, errors, _worker_loop, slots, conn, stop)


def _worker_loop(spec: ActorSpec, slots: list[EnvSlot], conn: Any, stop: Any) -> None:
    c = spec.config
    per_group = slots[0].num_envs
    groups = [
        VectorEnv(c.env, per_group, c.seed * 1000 + 100 * spec.index + 10 * g, c.env_step_delay_ms)
        for g in range(len(slots))
    ]
    for g, (envs, slot) in enumerate(zip(groups, slots)):
        slot.write_step(envs.reset(), np.zeros(per_group, np.float32), np.zeros(per_group, bool))
        conn.send_bytes(bytes([g]))
    while not stop.is_set():
        for g, (envs, slot) in enumerate(zip(groups, slots)):
            _wait(stop, lambda: conn.poll(_POLL_S), c.stall_timeout_s, "actions", spec.name)
            answered = conn.recv_bytes()[0]
            assert answered == g, f"{spec.name}: actions for group {answered}, expected {g}"
            step = envs.step(slot.read_actions())
            slot.write_step(step.obs, step.rewards, step.dones)
            conn.send_bytes(bytes([g]))
