"""A replay of past groups in the training loop: uniform or prioritized, bounded by staleness.

After a step its fresh groups enter a ring of ``capacity`` groups; before a step up to ``n``
groups are drawn again beside the fresh batch, only among groups within the run's staleness
bound, whole (one policy version per group), without replacement and seeded. ``uniform``:
IS weight 1 (``alpha = 0``); ``prioritized``: by the group's reward variance (a group whose
responses all scored the same teaches GRPO nothing), with
:class:`~nobubble.rl.algo.replay.PrioritizedReplayBuffer`'s probabilities and IS weights
over the eligible groups. Its settings: :class:`~nobubble.rl.system.config.ReplayConfig`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from nobubble.rl.system.config import ReplayConfig
    from nobubble.rl.system.types import SampleGroup

__all__ = ["GroupReplay"]


def _priority(group: SampleGroup) -> float:
    import torch

    rewards = torch.tensor([s.reward or 0.0 for s in group.samples], dtype=torch.float64)
    return float(rewards.var()) if rewards.numel() > 1 else 0.0


class GroupReplay:
    """The replay (see the module docstring); its state pickles into checkpoints."""

    def __init__(self, cfg: ReplayConfig, seed: int = 0, eps: float = 1e-6) -> None:
        from nobubble.rl.algo.replay import PrioritizedReplayBuffer

        alpha = cfg.alpha if cfg.mode == "prioritized" else 0.0
        self._buffer: PrioritizedReplayBuffer[SampleGroup] = PrioritizedReplayBuffer(
            max(1, cfg.capacity), alpha=alpha, eps=eps, seed=seed
        )

    def add(self, groups: list[SampleGroup]) -> None:
        self._buffer.extend(groups, [_priority(g) for g in groups])

    def sample(
        self, n: int, trainer_version: int, max_staleness: int, beta: float
    ) -> list[tuple[SampleGroup, float]]:
        """Up to ``n`` distinct groups with lag <= ``max_staleness``, with their IS weights."""
        if n < 1 or not len(self._buffer):
            return []
        floor = trainer_version - max_staleness
        drawn = self._buffer.sample(
            n, beta, eligible=lambda g: g.policy_version >= floor, replace=False
        )
        return list(zip(drawn.items, drawn.weights.tolist()))
