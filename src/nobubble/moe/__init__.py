"""MoE expert parallelism: DeepEP-style dispatch / combine, routers, a MoE layer.

The public names are :data:`__all__` (``_HOMES`` names each one's module); everything else
is importable from its module, e.g. ``nobubble.moe.fastpath.fp8.fp8_dispatch``,
``nobubble.moe.balance.rebalance_experts``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from nobubble.moe.buffer import Buffer, CombineResult, DispatchHandle, DispatchResult, Topology
    from nobubble.moe.experts import GroupedExperts
    from nobubble.moe.fastpath.shm_transport import ShmTransport
    from nobubble.moe.layer import MoEConfig, MoELayer, init_moe_weights
    from nobubble.moe.parallel import dp_ep_groups, sync_gradients
    from nobubble.moe.reference_layer import ReferenceMoE
    from nobubble.moe.routing import softmax_topk
    from nobubble.moe.transport import PeerFailure, TorchDistTransport, Transport, TransportError

# Each public name's module, imported on first use: ``import nobubble.moe.<module>`` for a
# torch-free module (``layout``, ``balance.policy``) then imports no torch (command-line checks).
_HOMES = {
    "Buffer": "buffer", "Topology": "buffer", "DispatchResult": "buffer",
    "CombineResult": "buffer", "DispatchHandle": "buffer", "GroupedExperts": "experts",
    "ShmTransport": "fastpath.shm_transport", "MoEConfig": "layer", "MoELayer": "layer",
    "init_moe_weights": "layer", "dp_ep_groups": "parallel", "sync_gradients": "parallel",
    "ReferenceMoE": "reference_layer", "softmax_topk": "routing", "PeerFailure": "transport",
    "TorchDistTransport": "transport", "Transport": "transport", "TransportError": "transport",
}  # fmt: skip


__all__ = [
    "Buffer",
    "Topology",
    "DispatchResult",
    "CombineResult",
    "DispatchHandle",
    "Transport",
    "TorchDistTransport",
    "ShmTransport",
    "TransportError",
    "PeerFailure",
    "softmax_topk",
    "MoEConfig",
    "MoELayer",
    "init_moe_weights",
    "ReferenceMoE",
    "GroupedExperts",
    "dp_ep_groups",
    "sync_gradients",
]


def __getattr__(name: str) -> Any:
    """The public name ``name``, from its module (imported now if it was not yet)."""
    if name not in _HOMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_HOMES[name]}"), name)
