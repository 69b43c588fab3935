"""Central batched inference (seed, sample-factory): the learner answers every actor.

:meth:`CentralInference.poll` waits (at most ``poll_s``) for the first env group to report,
then keeps collecting until one group per actor is in or ``inference_deadline_ms`` has
passed since the first (the batching deadline), runs *one* forward pass over all of them
and sends each its actions. Every observation goes through a :class:`TrajectoryBuilder`,
so the trajectories are assembled here, on the learner's side, as in SEED RL.
"""

from __future__ import annotations

import time
from multiprocessing.connection import wait
from typing import Any

import numpy as np
import torch

from nobubble.distributed import WorkerError
from nobubble.rl.actor_learner.config import EnvRunConfig
from nobubble.rl.actor_learner.model import PolicyModel, act
from nobubble.rl.actor_learner.shm import EnvSlot
from nobubble.rl.actor_learner.trajectory import Trajectory, TrajectoryBuilder

__all__ = ["CentralInference"]


class CentralInference:
    """Serves ``actors`` env workers, each with ``len(slots[a])`` env groups.

    Args:
        model: the learner's model (inference always uses the newest weights).
        names: ``(actors,)`` worker names, for errors.
        slots: ``slots[a][g]``, worker ``a``'s env group ``g``.
        conns: ``(actors,)`` the learner's ends of the workers' pipes.
    """

    def __init__(
        self,
        model: PolicyModel,
        config: EnvRunConfig,
        names: list[str],
        slots: list[list[EnvSlot]],
        conns: list[Any],
    ) -> None:
        self.model, self.config, self.names = model, config, names
        self.slots, self.conns = slots, conns
        self._actor_of = {id(c): a for a, c in enumerate(conns)}
        self._generator = torch.Generator().manual_seed(config.seed + 7)
        self.builders = [
            [
                TrajectoryBuilder(
                    f"{names[a]}/group-{g}",
                    config.unroll_length,
                    slot.num_envs,
                    slot.obs_dim,
                    model.num_actions,
                )  # fmt: skip
                for g, slot in enumerate(group)
            ]
            for a, group in enumerate(slots)
        ]
        self.busy_s = 0.0

    def _drain(self, ready_conns: list[Any], ready: list[tuple[int, int]]) -> None:
        for conn in ready_conns:
            a = self._actor_of[id(conn)]
            try:
                while conn.poll():
                    ready.append((a, conn.recv_bytes()[0]))
            except (EOFError, OSError):
                raise WorkerError(
                    f"{self.names[a]} closed its pipe (its process ended)", self.names[a]
                ) from None

    def _gather(self, poll_s: float) -> list[tuple[int, int]]:
        """``(actor, group)`` pairs whose observations are in, batched up to the deadline."""
        ready: list[tuple[int, int]] = []
        self._drain(wait(self.conns, timeout=poll_s), ready)
        if not ready:
            return ready
        deadline = time.monotonic() + self.config.inference_deadline_ms / 1000.0
        while len({a for a, _ in ready}) < len(self.conns):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            more = wait(self.conns, timeout=remaining)
            if not more:
                break
            self._drain(more, ready)
        return ready

    def poll(self, version: int, digest: str, poll_s: float = 0.1) -> list[Trajectory]:
        """Answer one batch of requests with policy ``version`` (the learner's model, whose
        published digest is ``digest``); the trajectories it finished."""
        ready = self._gather(poll_s)
        if not ready:
            return []
        start = time.perf_counter()
        finished: list[Trajectory] = []
        observations = []
        for a, g in ready:
            obs, reward, done = self.slots[a][g].read_step()  # (K, D), (K,), (K,)
            trajectory = self.builders[a][g].observe(obs, reward, done)
            if trajectory is not None:
                finished.append(trajectory)
            observations.append(obs)
        actions, logits = act(self.model, np.concatenate(observations), self._generator)
        offset = 0
        for a, g in ready:
            k = self.slots[a][g].num_envs
            self.slots[a][g].write_actions(actions[offset : offset + k])
            self.builders[a][g].record(
                actions[offset : offset + k], logits[offset : offset + k], version,
                digest,
            )  # fmt: skip
            offset += k
            self.conns[a].send_bytes(bytes([g]))
        self.busy_s += time.perf_counter() - start
        return finished
