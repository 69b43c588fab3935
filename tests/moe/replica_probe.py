"""Which physical replica served each slot: the tests' window into a ReplicatedMoELayer.

The layer picks replicas inside its forward (:class:`~nobubble.moe.balance.replicas.
ReplicaRouter`); the reference MoE needs those choices (``physical_idx``) to say which
replica's weights each slot used and so give every replica its own gradient.
"""

from __future__ import annotations

from typing import Any

import torch


class RecordingReplicaRouter:
    """Wraps a layer's replica router: same answers, each one kept in :attr:`chosen`.

    Install with ``layer.replica_router = RecordingReplicaRouter(layer.replica_router)``;
    everything else (``set_placement``, the counters) goes to the wrapped router.
    """

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.chosen: list[torch.Tensor] = []  # (N, K) int64 physical ids, one per forward

    def __call__(self, topk_idx: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        self.chosen.append(self.inner(topk_idx, **kwargs))
        return self.chosen[-1]

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)
