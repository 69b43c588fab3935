"""The actor processes: an IMPALA actor with its own policy copy, or an env-only worker for
central inference (seed: one env group; sample-factory: two, double buffered).

Each runs under :func:`nobubble.distributed.supervised` (it dies with its parent, beats its
heartbeat slot, and on any error puts ``(name, report)`` on the error queue before exiting 1)
and waits on nothing without a timeout. The worker's protocol per env group ``g``: it writes
``obs``, ``reward`` and ``done`` into ``slots[g]`` and sends the byte ``g``; the learner
writes ``action`` and sends ``g`` back. Each side writes only after receiving the other's
byte, so the shared memory needs no lock; with two groups the worker steps one while the
learner runs inference for the other.
"""

from __future__ import annotations

import functools
import queue as queue_module
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from nobubble.distributed import Ward, supervised
from nobubble.rl.actor_learner.config import EnvRunConfig
from nobubble.rl.actor_learner.envs import VectorEnv

__all__ = ["ActorSpec", "ActorStopped", "EnvSlot", "run_actor"]

_POLL_S = 0.2  # how often a blocked actor looks at the stop flag
_SLOT_TYPES = {"obs": ("f", np.float32), "reward": ("f", np.float32),
               "done": ("b", np.int8), "action": ("q", np.int64)}  # fmt: skip


class EnvSlot:
    """Shared memory of ``K`` envs: ``obs (K, D)`` float32, ``reward (K,)`` float32 and
    ``done (K,)`` int8 written by the worker, ``action (K,)`` int64 by the learner.

    ``slot[name]`` is a numpy view of one array; the raw arrays are made by the parent and
    inherited by (or pickled to) the worker.
    """

    def __init__(self, mp_context: Any, num_envs: int, obs_dim: int) -> None:
        self.num_envs, self.obs_dim = num_envs, obs_dim
        self._raw = {name: mp_context.RawArray(code, num_envs * (obs_dim if name == "obs" else 1))
                     for name, (code, _) in _SLOT_TYPES.items()}  # fmt: skip

    def __getitem__(self, name: str) -> np.ndarray:
        view = np.frombuffer(self._raw[name], dtype=_SLOT_TYPES[name][1])
        return view.reshape(self.num_envs, self.obs_dim) if name == "obs" else view

    def write_step(self, obs: np.ndarray, reward: np.ndarray, done: np.ndarray) -> None:
        """Worker side: ``obs (K, D)``, ``reward (K,)``, ``done (K,)`` after a step."""
        self["obs"][:], self["reward"][:], self["done"][:] = obs, reward, done

    def read_step(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Learner side: copies of ``obs (K, D)``, ``reward (K,)``, ``done (K,)`` bool."""
        return self["obs"].copy(), self["reward"].copy(), self["done"].astype(bool)


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


def run_actor(spec: ActorSpec, channel: tuple[Any, ...], stop: Any, errors: Any) -> None:
    """Process entry: the actor loop of ``spec.config.arch`` under :func:`supervised`, until
    ``stop`` is set. ``channel``: impala ``(SharedWeights, trajectory queue)``, else
    ``(slots, pipe end)``; ``errors``: the queue its report goes to."""

    def report(text: str) -> None:
        errors.put((spec.name, text))
        errors.close()
        errors.join_thread()  # delivered before the process exits

    def until_stopped() -> None:
        try:
            (_impala_loop if spec.config.arch == "impala" else _worker_loop)(spec, *channel, stop)
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


def _offer(queue: Any, item: Any) -> bool:
    """Put ``item`` on the bounded ``queue``; False when it stayed full for ``_POLL_S``."""
    try:
        queue.put(item, timeout=_POLL_S)
    except queue_module.Full:
        return False
    return True


def _impala_loop(spec: ActorSpec, weights: Any, queue: Any, stop: Any) -> None:
    """Roll out with a local policy copy, pulled before each unroll; stream to ``queue``."""
    import torch

    from nobubble.rl.actor_learner.model import build_model, rollout
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
        offer = functools.partial(_offer, queue, trajectory)
        _wait(stop, offer, c.stall_timeout_s, "the learner to take a trajectory", spec.name)


def _worker_loop(spec: ActorSpec, slots: list[EnvSlot], conn: Any, stop: Any) -> None:
    """Step the env groups of ``slots``, exchanging observations and actions through them."""
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
            step = envs.step(slot["action"].copy())
            slot.write_step(step.obs, step.rewards, step.dones)
            conn.send_bytes(bytes([g]))
