"""Trajectories: ``T`` steps of ``K`` environments, who made them and under which policy.

Shapes are time-major, as V-trace takes them: ``T`` steps, ``K`` environments, ``D``
observation features, ``A`` actions; ``T + 1`` observations, the last one only to bootstrap
the value.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np
import torch

__all__ = ["Trajectory", "TrajectoryBatch", "TrajectoryBuilder", "stack_trajectories"]


@dataclass(frozen=True)
class Trajectory:
    """One unroll; to the :class:`~nobubble.rl.system.experience.ExperienceBuffer` one group of
    one sample, whose rewards came with its steps.

    Attributes:
        source: the actor (and env group) that stepped it, e.g. ``"actor-1/group-0"``.
        seq: its number among that source's trajectories, from 0 (the ledger's key).
        policy_version: the oldest policy version that chose one of its actions.
        obs: ``(T + 1, K, D)`` float32.
        actions: ``(T, K)`` int64.
        behaviour_logits: ``(T, K, A)`` float32, the logits the actions were sampled from.
        rewards: ``(T, K)`` float32.
        dones: ``(T, K)`` bool, the episode ended at step t (no bootstrap across it).
        episode_returns: returns of the episodes that ended inside this unroll.
        weight_digests: ``(version, digest)`` of every policy version that chose one of its
            actions, as the actor (or central inference) hashed the weights it used
            (:func:`~nobubble.rl.system.weight_sync.weight_digest`); the learner checks them.
        group_id: its number among the trajectories the learner received (-1 until then).
    """

    source: str
    seq: int
    policy_version: int
    obs: np.ndarray
    actions: np.ndarray
    behaviour_logits: np.ndarray
    rewards: np.ndarray
    dones: np.ndarray
    episode_returns: tuple[float, ...]
    weight_digests: tuple[tuple[int, str], ...] = ()
    group_id: int = -1

    @property
    def key(self) -> tuple[str, int]:
        return (self.source, self.seq)

    @property
    def sample_ids(self) -> tuple[int, ...]:
        return (self.group_id,)

    @property
    def newest_version(self) -> int:
        return self.policy_version

    @property
    def reward_failed(self) -> bool:
        return False  # an environment's rewards come with its steps

    @property
    def num_steps(self) -> int:
        """Environment steps in it: ``T * K``."""
        return int(self.actions.size)


@dataclass(frozen=True)
class TrajectoryBatch:
    """Trajectories side by side along the environment axis: ``B = sum K``.

    Attributes: obs ``(T + 1, B, D)``, actions ``(T, B)``, behaviour_logits ``(T, B, A)``,
    rewards ``(T, B)``, dones ``(T, B)`` float (1 where the episode ended), as tensors.
    """

    obs: torch.Tensor
    actions: torch.Tensor
    behaviour_logits: torch.Tensor
    rewards: torch.Tensor
    dones: torch.Tensor

    def columns(self, index: torch.Tensor) -> TrajectoryBatch:
        """The environments ``index`` (``(b,)`` int64) of this batch."""
        return TrajectoryBatch(**{f.name: getattr(self, f.name)[:, index] for f in fields(self)})


def stack_trajectories(trajectories: list[Trajectory]) -> TrajectoryBatch:
    """Concatenate trajectories of equal ``T`` along the environment axis."""
    if not trajectories:
        raise ValueError("stack_trajectories: no trajectories; pass at least one")
    lengths = {t.actions.shape[0] for t in trajectories}
    if len(lengths) != 1:
        raise ValueError(f"stack_trajectories: unroll lengths {sorted(lengths)} differ")
    columns = {
        f.name: torch.from_numpy(np.concatenate([getattr(t, f.name) for t in trajectories], 1))
        for f in fields(TrajectoryBatch)
    }
    return TrajectoryBatch(**{**columns, "dones": columns["dones"].float()})


class TrajectoryBuilder:
    """Assembles the trajectories of one env stream (an impala actor's own envs, or a
    worker's env group as central inference sees it).

    Lifecycle per step ``t``: :meth:`observe` (the observation after the previous action,
    with that action's reward and done) then :meth:`record` (the action chosen for it).
    Every ``T`` steps :meth:`observe` returns the finished trajectory, whose last observation
    is also the first of the next one. Episode returns are summed here from the rewards.
    """

    def __init__(
        self, source: str, unroll_length: int, num_envs: int, obs_dim: int, num_actions: int
    ) -> None:
        self.source, self.T, self.K = source, unroll_length, num_envs
        self._shape = (obs_dim, num_actions)
        self._seq = 0
        self._running = np.zeros(num_envs, dtype=np.float64)  # (K,) episode sums
        self._pending = False  # an action was chosen and its reward not yet seen
        self._new()

    def _new(self) -> None:
        (D, A), T, K = self._shape, self.T, self.K
        self.obs = np.zeros((T + 1, K, D), dtype=np.float32)
        self.actions = np.zeros((T, K), dtype=np.int64)
        self.logits = np.zeros((T, K, A), dtype=np.float32)
        self.rewards = np.zeros((T, K), dtype=np.float32)
        self.dones = np.zeros((T, K), dtype=bool)
        self.t, self.version = 0, -1
        self.returns: list[float] = []
        self.claims: dict[int, str] = {}  # version -> digest of the weights that acted

    def observe(
        self, obs: np.ndarray, reward: np.ndarray | None = None, done: np.ndarray | None = None
    ) -> Trajectory | None:
        """Record ``obs (K, D)`` and the previous action's ``reward (K,)``, ``done (K,)``
        (none before the first action)."""
        if self._pending:
            assert reward is not None and done is not None, f"{self.source}: no reward, done"
            self.rewards[self.t - 1], self.dones[self.t - 1] = reward, done
            self._running += reward
            for k in np.flatnonzero(done):
                self.returns.append(float(self._running[k]))
                self._running[k] = 0.0
            self._pending = False
        finished = None
        if self.t == self.T:
            self.obs[self.T] = obs
            finished = Trajectory(
                self.source, self._seq, self.version, self.obs, self.actions, self.logits,
                self.rewards, self.dones, tuple(self.returns), tuple(sorted(self.claims.items())),
            )  # fmt: skip
            self._seq += 1
            self._new()
        self.obs[self.t] = obs
        return finished

    def record(
        self, actions: np.ndarray, logits: np.ndarray, version: int, digest: str = ""
    ) -> None:
        """The actions ``(K,)`` and logits ``(K, A)`` chosen by policy ``version``, whose
        weights hash to ``digest``."""
        self.actions[self.t], self.logits[self.t] = actions, logits
        self.version = version if self.version < 0 else min(self.version, version)
        self.claims[version] = digest
        self.t += 1
        self._pending = True
