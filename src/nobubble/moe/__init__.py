"""MoE expert parallelism: DeepEP-style dispatch / combine, routers, a MoE layer.

Public names, by where they live::

    # the core (this package)
    get_dispatch_layout, DispatchLayout          # who goes where (layout.py)
    Buffer, DispatchResult, CombineResult, DispatchHandle   # dispatch / combine (buffer.py)
    Transport, PeerWrites, TorchDistTransport, TransportStats, TransportError  # (transport.py)
    PeerFailure, FailureMasking, PHASES          # failed peers: who, in which phase (transport.py)
    MaskingStats                                  # drops / re-routes of masked ranks (masking.py)
    reference_dispatch, reference_combine        # the slow all-gather reference (reference.py)
    softmax_topk, deepseek_v3_topk, update_expert_bias, Routing   # routers (routing.py)
    MoEConfig, MoEWeights, init_moe_weights, MoELayer   # the layer (layer.py)
    ReferenceMoE, reference_moe_forward          # the slow token-by-token layer (reference_layer.py)
    GroupedExperts                               # your per-expert modules (experts.py)
    dp_ep_groups, DataExpertGroups, expert_parameters, non_expert_parameters,
    sync_gradients                               # data x expert parallelism (parallel.py)
    # fast paths (fastpath/)
    make_buffer                                   # Buffer for a transport kind: auto/shm/dist
    ShmTransport, make_transport, ShmBuffer       # shared memory between ranks of one host
    HierarchicalBuffer                            # once per node across nodes
    LowLatencyBuffer                              # fixed-capacity decode mode
    fp8_dispatch                                  # e4m3 dispatch, one scale per 128 channels
    overlapped_forward                            # chunked comm/compute overlap
    # load balancing (balance/)
    rebalance_experts, ExpertPlacement            # EPLB placement
    rebalance_experts_incremental, IncrementalRebalance, count_moves   # move few experts
    route_to_replicas, ReplicaRouter              # logical -> physical experts
    ExpertLoadStats                               # live load statistics
    ReplicatedMoELayer                            # MoE layer with redundant experts
    rebalance_online, plan_migration              # move experts between ranks while training
"""

from __future__ import annotations

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
from nobubble.moe.buffer import Buffer, CombineResult, DispatchHandle, DispatchResult
from nobubble.moe.experts import GroupedExperts
from nobubble.moe.fastpath.fp8 import fp8_dispatch
from nobubble.moe.fastpath.hierarchical import HierarchicalBuffer
from nobubble.moe.fastpath.low_latency import LowLatencyBuffer
from nobubble.moe.fastpath.overlap import overlapped_forward
from nobubble.moe.fastpath.shm_buffer import ShmBuffer, make_buffer
from nobubble.moe.fastpath.shm_transport import ShmTransport, make_transport
from nobubble.moe.layer import MoEConfig, MoELayer, MoEWeights, init_moe_weights
from nobubble.moe.layout import DispatchLayout, get_dispatch_layout
from nobubble.moe.masking import MaskingStats
from nobubble.moe.parallel import (
    DataExpertGroups,
    dp_ep_groups,
    expert_parameters,
    non_expert_parameters,
    sync_gradients,
)
from nobubble.moe.reference import reference_combine, reference_dispatch
from nobubble.moe.reference_layer import ReferenceMoE, reference_moe_forward
from nobubble.moe.routing import Routing, deepseek_v3_topk, softmax_topk, update_expert_bias
from nobubble.moe.transport import (
    PHASES,
    FailureMasking,
    PeerFailure,
    PeerWrites,
    TorchDistTransport,
    Transport,
    TransportError,
    TransportStats,
)

__all__ = [
    "PHASES",
    "Buffer",
    "CombineResult",
    "DataExpertGroups",
    "GroupedExperts",
    "DispatchHandle",
    "DispatchLayout",
    "DispatchResult",
    "ExpertLoadStats",
    "ExpertPlacement",
    "FailureMasking",
    "HierarchicalBuffer",
    "IncrementalRebalance",
    "LowLatencyBuffer",
    "MaskingStats",
    "MoEConfig",
    "MoELayer",
    "MoEWeights",
    "PeerFailure",
    "PeerWrites",
    "ReferenceMoE",
    "ReplicaRouter",
    "ReplicatedMoELayer",
    "Routing",
    "ShmBuffer",
    "ShmTransport",
    "TorchDistTransport",
    "Transport",
    "TransportError",
    "TransportStats",
    "count_moves",
    "deepseek_v3_topk",
    "dp_ep_groups",
    "expert_parameters",
    "non_expert_parameters",
    "sync_gradients",
    "fp8_dispatch",
    "get_dispatch_layout",
    "init_moe_weights",
    "make_buffer",
    "make_transport",
    "overlapped_forward",
    "plan_migration",
    "rebalance_experts",
    "rebalance_experts_incremental",
    "rebalance_online",
    "reference_combine",
    "reference_dispatch",
    "reference_moe_forward",
    "route_to_replicas",
    "softmax_topk",
    "update_expert_bias",
]
