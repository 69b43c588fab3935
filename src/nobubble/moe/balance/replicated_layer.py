"""A MoE layer whose ranks hold *physical* experts: replicas of hot logical experts.

Wraps :class:`~nobubble.moe.layer.MoELayer` and its buffer unchanged: the router picks logical
experts, :class:`~nobubble.moe.balance.replicas.ReplicaRouter` rewrites them to physical ids,
and rank ``r`` owns physical experts ``[r * P, (r + 1) * P)``. Replicas start equal, and
:meth:`ReplicatedMoELayer.sync_replica_grads` gives each the sum of its replicas' gradients
(the logical expert's gradient), so they stay equal and the layer computes the same function
as one without replicas.

Shape legend: ``N`` tokens, ``H`` hidden, ``E`` logical experts, ``R`` physical experts,
``P = R / ranks`` physical experts per rank, ``M`` rows received.
"""

from __future__ import annotations

import torch
from torch import nn

from nobubble.moe.balance.eplb import ExpertPlacement, placement_from_phy2log
from nobubble.moe.balance.load_stats import ExpertLoadStats, logical_load
from nobubble.moe.balance.replicas import ReplicaRouter, ReplicaStrategy
from nobubble.moe.buffer import Buffer
from nobubble.moe.layer import MoEConfig, MoELayer, MoEWeights

__all__ = ["ReplicatedMoELayer", "EXPERT_PARAMS"]

EXPERT_PARAMS: tuple[str, ...] = ("w_gate", "w_up", "w_down")


class ReplicatedMoELayer(MoELayer):
    """Expert-parallel MoE with redundant experts placed by ``phy2log``.

    Args:
        config: the layer's shape (``num_experts`` = logical experts ``E``).
        weights: every logical expert's weights (each rank copies its replicas' rows).
        buffer: the expert-parallel buffer; ``R`` must be a multiple of its rank count.
        phy2log: ``(R,)`` int64 logical expert of each physical expert (one layer of an
            :class:`~nobubble.moe.balance.eplb.ExpertPlacement`); every expert at least once.
        strategy: replica routing ("token_hash", "round_robin", "least_loaded").
        stats_window: steps in the moving average of :attr:`load_stats`.
    """

    local_expert_recv_stats: torch.Tensor  # a buffer (register_buffer), for the type checker

    def __init__(
        self,
        config: MoEConfig,
        weights: MoEWeights,
        buffer: Buffer,
        phy2log: torch.Tensor,
        *,
        strategy: ReplicaStrategy = "round_robin",
        stats_window: int = 16,
    ) -> None:
        super().__init__(config, weights, buffer)  # router, shared experts, bias
        placement = self._placement(phy2log)
        own = placement.phy2log[0, self._own_slice(placement.num_replicas)]  # (P,)
        self.w_gate = nn.Parameter(weights.w_gate[own].clone())  # (P, I, H)
        self.w_up = nn.Parameter(weights.w_up[own].clone())  # (P, I, H)
        self.w_down = nn.Parameter(weights.w_down[own].clone())  # (P, H, I)
        self.placement = placement
        self.replica_router = ReplicaRouter(placement.log2phy[0], placement.logcnt[0], strategy)
        self.register_buffer(
            "local_expert_recv_stats", torch.zeros(own.numel(), dtype=torch.int64)
        )  # (P,) DeepEP's cumulative_local_expert_recv_stats, summed until collected
        self.load_stats = ExpertLoadStats(
            num_logical_experts=config.num_experts, window=stats_window
        )
        self.last_physical_load: torch.Tensor | None = None  # (R,) int64, last forward

    # -- placement ----------------------------------------------------------------------------
    def _placement(self, phy2log: torch.Tensor) -> ExpertPlacement:
        phy2log = torch.as_tensor(phy2log, dtype=torch.int64).cpu().view(1, -1)  # (1, R)
        num_replicas, ranks = phy2log.shape[1], self.buffer.num_ranks
        if num_replicas % ranks:
            raise ValueError(
                f"ReplicatedMoELayer: {num_replicas} physical experts do not split over "
                f"{ranks} ranks; use a multiple of {ranks}"
            )
        return placement_from_phy2log(phy2log, self.config.num_experts, ranks, 1, "global")

    def _own_slice(self, num_replicas: int) -> slice:
        per_rank = num_replicas // self.buffer.num_ranks
        return slice(self.buffer.rank * per_rank, (self.buffer.rank + 1) * per_rank)

    @property
    def phy2log(self) -> torch.Tensor:
        """(R,) int64 current placement."""
        return self.placement.phy2log[0]

    @property
    def own_logical_experts(self) -> torch.Tensor:
        """(P,) int64 the logical expert behind each local physical expert."""
        return self.phy2log[self._own_slice(self.placement.num_replicas)]

    def set_placement(self, phy2log: torch.Tensor) -> None:
        """Adopt a new placement (weights must already be moved: see balance_online)."""
        placement = self._placement(phy2log)
        if placement.num_replicas != self.placement.num_replicas:
            raise ValueError(
                f"set_placement: {placement.num_replicas} physical experts, the layer holds "
                f"{self.placement.num_replicas}"
            )
        self.placement = placement
        self.replica_router.set_placement(placement.log2phy[0], placement.logcnt[0])
        self.last_physical_load = None

    # -- forward / backward -------------------------------------------------------------------
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``[..., H]`` -> ``[..., H]``; same function as the layer without replicas."""
        shape = x.shape
        x = x.reshape(-1, shape[-1])  # (N, H)
        routing = self.route(x)  # logical topk_idx (N, K)
        token_ids = torch.arange(x.shape[0], device=x.device) + (self.buffer.rank << 32)
        prior = self.last_physical_load
        phys_idx = self.replica_router(
            routing.topk_idx,
            token_ids=token_ids,
            replica_load=None if prior is None else prior.double() / self.buffer.num_ranks,
        )  # (N, K) physical ids
        out, physical = self.dispatch_experts_combine(
            x,
            phys_idx,
            routing.topk_weights,
            num_experts=self.placement.num_replicas,
            recv_stats=self.local_expert_recv_stats,
        )
        physical = physical.cpu()
        self.last_physical_load = physical  # (R,)
        self.last_tokens_per_expert = logical_load(physical, self.phy2log, self.config.num_experts)
        shared = self.shared_out(x)
        if shared is not None:
            out = out + shared
        return out.reshape(shape)

    def sync_replica_grads(self) -> None:
        """Give every replica the sum of its logical expert's replica gradients (collective).

        One all-gather of the local expert gradients, ``(P, numel)`` per rank; every rank
        sums the replicas of each logical expert in physical order, so all replicas get the
        same bits. Call on every rank after backward, before the optimizer step.
        """
        params = [getattr(self, name) for name in EXPERT_PARAMS]
        per_rank = params[0].shape[0]
        grads = [
            (p.grad if p.grad is not None else torch.zeros_like(p)).reshape(per_rank, -1)
            for p in params
        ]
        flat = torch.cat(grads, dim=1)  # (P, numel)
        every = self.buffer.transport.all_gather(flat, kind="replica_grad")  # (R, numel)
        summed = torch.zeros(
            (self.config.num_experts, flat.shape[1]), dtype=flat.dtype, device=flat.device
        ).index_add_(0, self.phy2log.to(flat.device), every)  # (E, numel)
        mine = summed[self.own_logical_experts.to(flat.device)]  # (P, numel)
        start = 0
        for p, g in zip(params, grads):
            p.grad = mine[:, start : start + g.shape[1]].reshape(p.shape).clone()
            start += g.shape[1]

    @torch.no_grad()
    def collect_load_stats(self) -> torch.Tensor:
        """Gather every rank's cumulative counters, record them, reset them (collective).

        Returns ``(E,)`` int64: tokens per logical expert since the last collection.
        """
        counts = self.local_expert_recv_stats.clone()
        physical = self.buffer.transport.all_gather(counts, kind="load_stats").cpu()  # (R,)
        load = logical_load(physical, self.phy2log, self.config.num_experts)
        self.load_stats.record(load)
        self.local_expert_recv_stats.zero_()
        return load
