"""MoE expert parallelism: DeepEP-style dispatch / combine, routers, a MoE layer.

Public names::

    get_dispatch_layout, DispatchLayout          # who goes where (layout.py)
    Buffer, DispatchResult, CombineResult, DispatchHandle   # dispatch / combine (buffer.py)
    Transport, TorchDistTransport, TransportStats, TransportError   # the seam (transport.py)
    reference_dispatch, reference_combine        # the slow per-pair reference (reference.py)
    softmax_topk, deepseek_v3_topk, update_expert_bias, Routing   # routers (routing.py)
    MoEConfig, MoEWeights, init_moe_weights, MoELayer, DenseMoE   # the layer (layer.py)
"""

from __future__ import annotations

from nobubble.moe.buffer import Buffer, CombineResult, DispatchHandle, DispatchResult
from nobubble.moe.layer import DenseMoE, MoEConfig, MoELayer, MoEWeights, init_moe_weights
from nobubble.moe.layout import DispatchLayout, get_dispatch_layout
from nobubble.moe.reference import reference_combine, reference_dispatch
from nobubble.moe.routing import Routing, deepseek_v3_topk, softmax_topk, update_expert_bias
from nobubble.moe.transport import TorchDistTransport, Transport, TransportError, TransportStats

__all__ = [
    "Buffer",
    "CombineResult",
    "DenseMoE",
    "DispatchHandle",
    "DispatchLayout",
    "DispatchResult",
    "MoEConfig",
    "MoELayer",
    "MoEWeights",
    "Routing",
    "TorchDistTransport",
    "Transport",
    "TransportError",
    "TransportStats",
    "deepseek_v3_topk",
    "get_dispatch_layout",
    "init_moe_weights",
    "reference_combine",
    "reference_dispatch",
    "softmax_topk",
    "update_expert_bias",
]
