"""MoE load balancing: where experts live, how tokens pick a replica, when experts move.

- :mod:`.eplb`, :mod:`.packing`: EPLB placement (hierarchical and global), balanced packing;
  :mod:`.eplb_reference`: a line-by-line transcription of DeepSeek's ``eplb.py`` to test against;
  :mod:`.problem`: the checks of a placement problem, without torch (the command line's).
- :mod:`.incremental`: a new placement that moves as few experts as it can.
- :mod:`.replicas`: logical -> physical experts (token hash, round robin, least loaded).
- :mod:`.load_stats`: live per-expert load statistics.
- :mod:`.replicated_layer`: a MoE layer with redundant experts.
- :mod:`.online`: move experts between ranks while training.
- :mod:`.loads`: synthetic and file-read expert loads; :mod:`.report`: one placement measured
  against no redundancy and the original EPLB (``nobubble ep balance``), and its picture.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from nobubble.moe.balance.eplb import ExpertPlacement, rebalance_experts
    from nobubble.moe.balance.incremental import (
        IncrementalRebalance,
        count_moves,
        rebalance_experts_incremental,
    )
    from nobubble.moe.balance.load_stats import ExpertLoadStats
    from nobubble.moe.balance.online import plan_migration, rebalance_online
    from nobubble.moe.balance.replicas import ReplicaRouter, route_to_replicas
    from nobubble.moe.balance.replicated_layer import ReplicatedMoELayer

# Each public name's module, imported on first use, so that the torch-free :mod:`.policy`
# (the command line's checks) imports no torch.
_HOMES = {
    "ExpertPlacement": "eplb", "rebalance_experts": "eplb",
    "IncrementalRebalance": "incremental", "count_moves": "incremental",
    "rebalance_experts_incremental": "incremental", "ExpertLoadStats": "load_stats",
    "plan_migration": "online", "rebalance_online": "online", "ReplicaRouter": "replicas",
    "route_to_replicas": "replicas", "ReplicatedMoELayer": "replicated_layer",
}  # fmt: skip


__all__ = [
    "ExpertPlacement",
    "rebalance_experts",
    "IncrementalRebalance",
    "count_moves",
    "rebalance_experts_incremental",
    "ExpertLoadStats",
    "plan_migration",
    "rebalance_online",
    "ReplicaRouter",
    "route_to_replicas",
    "ReplicatedMoELayer",
]


def __getattr__(name: str) -> Any:
    """The public name ``name``, from its module (imported now if it was not yet)."""
    if name not in _HOMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_HOMES[name]}"), name)
