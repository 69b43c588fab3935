"""A MoE layer over :class:`Buffer`: router -> top-k -> dispatch -> local experts -> combine.

``MoELayer`` (one per rank) weights each expert output row by its top-k weight before
``combine`` and adds the shared experts. Router and experts may be the user's modules (a
router returns logits ``[N, E]`` or a ``Routing``). Its reference is
:class:`~nobubble.moe.reference_layer.ReferenceMoE`.

Shape legend: ``N`` tokens, ``H`` hidden, ``I`` expert hidden, ``E`` experts, ``L`` local
experts, ``K`` top-k, ``M`` rows received by this rank.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from nobubble.moe.buffer import Buffer
from nobubble.moe.experts import check_expert_output
from nobubble.moe.layout import MoEConfig
from nobubble.moe.routing import Routing, deepseek_v3_topk, softmax_topk, update_expert_bias

__all__ = ["MoEConfig", "MoEWeights", "init_moe_weights", "MoELayer", "swiglu"]


@dataclass(frozen=True, eq=False)
class MoEWeights:
    """All of a layer's weights (every expert), from which per-rank layers take their slice.

    Attributes:
        router: ``[E, H]``.
        w_gate, w_up: ``[E, I, H]``; w_down: ``[E, H, I]``.
        shared_gate, shared_up: ``[S*I, H]``; shared_down: ``[H, S*I]`` (None without shared).
        expert_bias: ``[E]`` DeepSeek-V3 selection bias.
    """

    router: torch.Tensor
    w_gate: torch.Tensor
    w_up: torch.Tensor
    w_down: torch.Tensor
    shared_gate: torch.Tensor | None
    shared_up: torch.Tensor | None
    shared_down: torch.Tensor | None
    expert_bias: torch.Tensor


def init_moe_weights(
    config: MoEConfig, *, seed: int = 0, dtype: torch.dtype = torch.float32
) -> MoEWeights:
    """Deterministic weights (same on every rank for the same seed), scaled like nn.Linear."""
    g = torch.Generator().manual_seed(seed)
    h, i, e = config.hidden, config.expert_hidden, config.num_experts

    def w(*shape: int) -> torch.Tensor:
        return (torch.randn(*shape, generator=g) / shape[-1] ** 0.5).to(dtype)

    s = config.num_shared_experts * i
    return MoEWeights(
        router=w(e, h),
        w_gate=w(e, i, h),
        w_up=w(e, i, h),
        w_down=w(e, h, i),
        shared_gate=w(s, h) if s else None,
        shared_up=w(s, h) if s else None,
        shared_down=w(h, s) if s else None,
        expert_bias=(torch.randn(e, generator=g) * 0.01).to(torch.float32),
    )


def swiglu(
    x: torch.Tensor, w_gate: torch.Tensor, w_up: torch.Tensor, w_down: torch.Tensor
) -> torch.Tensor:
    """``(silu(x W_g^T) * x W_u^T) W_d^T``: ``[n, H]`` -> ``[n, H]``."""
    return (F.silu(x @ w_gate.t()) * (x @ w_up.t())) @ w_down.t()


def apply_experts(
    x: torch.Tensor,
    topk_idx: torch.Tensor,
    topk_weights: torch.Tensor,
    w_gate: torch.Tensor,
    w_up: torch.Tensor,
    w_down: torch.Tensor,
) -> torch.Tensor:
    """Weighted sum over slots of ``expert[topk_idx](x)``; ids outside ``[0, len(w_gate))`` skip.

    Every expert runs, even on zero rows, so the autograd graph has the same shape on every
    rank (combine's backward is a collective: all ranks must reach it).
    """
    out = torch.zeros_like(x)  # (n, H)
    for e in range(w_gate.shape[0]):
        rows, slots = (topk_idx == e).nonzero(as_tuple=True)
        y = swiglu(x[rows], w_gate[e], w_up[e], w_down[e])  # (rows, H)
        out = out.index_add(0, rows, y * topk_weights[rows, slots].unsqueeze(1).to(y.dtype))
    return out


class MoELayer(nn.Module):
    """Expert-parallel MoE: this rank holds experts ``[rank * L, (rank + 1) * L)``.

    Args:
        config: the layer's shape.
        weights: all experts' weights (this rank keeps its slice); may be None when both
            ``router`` and ``experts`` are given.
        buffer: the expert-parallel :class:`Buffer`.
        router: the user's router module, ``[N, H] -> logits [N, E]`` or a ``Routing``
            (default: a ``[E, H]`` router from ``weights``).
        experts: the user's module for this rank's experts, ``(recv_x [M, H], local ids
            [M, K], weights [M, K]) -> [M, H]``, e.g. :class:`~nobubble.moe.experts.
            GroupedExperts` (default: grouped SwiGLU from ``weights``).

    :meth:`expert_parameters` names the routed experts' parameters for
    :func:`~nobubble.moe.parallel.sync_gradients`.
    """

    expert_bias: torch.Tensor  # a buffer (register_buffer), for the type checker

    def __init__(
        self,
        config: MoEConfig,
        weights: MoEWeights | None,
        buffer: Buffer,
        *,
        router: nn.Module | None = None,
        experts: nn.Module | None = None,
    ) -> None:
        super().__init__()
        if config.num_experts % buffer.num_ranks != 0:
            raise ValueError(
                f"MoELayer: num_experts={config.num_experts} is not a multiple of "
                f"{buffer.num_ranks} expert-parallel ranks"
            )
        if weights is None and router is None:
            raise ValueError(f"{type(self).__name__}: give weights, or a router module")
        self.config = config
        self.router_module = router
        self.router = None if weights is None else nn.Parameter(weights.router.clone())
        bias = torch.zeros(config.num_experts) if weights is None else weights.expert_bias
        self.register_buffer("expert_bias", bias.clone())
        self.shared = None
        if weights is not None and weights.shared_gate is not None:
            # init_moe_weights sets the three shared tensors together
            assert weights.shared_up is not None and weights.shared_down is not None
            self.shared = nn.ParameterList(
                [
                    nn.Parameter(t.clone())
                    for t in (weights.shared_gate, weights.shared_up, weights.shared_down)
                ]
            )
        self.last_tokens_per_expert: torch.Tensor | None = None
        self.buffer = buffer
        self.experts = experts
        if experts is None:
            if weights is None:
                raise ValueError("MoELayer: give weights, or an experts module")
            local = config.num_experts // buffer.num_ranks
            own = slice(buffer.rank * local, (buffer.rank + 1) * local)
            self.w_gate = nn.Parameter(weights.w_gate[own].clone())  # (L, I, H)
            self.w_up = nn.Parameter(weights.w_up[own].clone())  # (L, I, H)
            self.w_down = nn.Parameter(weights.w_down[own].clone())  # (L, H, I)

    def route(self, x: torch.Tensor) -> Routing:
        """``x [N, H]`` -> top-k experts ``[N, K]`` and weights ``[N, K]`` by ``config.router``."""
        if self.router_module is not None:
            decision = self.router_module(x)
            if isinstance(decision, Routing):
                return decision
            if not isinstance(decision, torch.Tensor) or decision.shape != (
                x.shape[0],
                self.config.num_experts,
            ):
                got = getattr(decision, "shape", type(decision).__name__)
                raise ValueError(
                    f"router module {type(self.router_module).__name__} returned {got}; a "
                    f"router returns logits [N, {self.config.num_experts}] or a Routing"
                )
            logits = decision  # (N, E)
        else:
            assert self.router is not None  # __init__ requires weights or a router module
            logits = x @ self.router.t()  # (N, E)
        c = self.config
        if c.router == "softmax":
            return softmax_topk(logits, c.topk)
        return deepseek_v3_topk(
            logits,
            c.topk,
            n_groups=c.n_groups,
            topk_groups=c.topk_groups,
            bias=self.expert_bias,
            route_scale=c.route_scale,
        )

    def shared_out(self, x: torch.Tensor) -> torch.Tensor | None:
        """The shared experts on ``x [N, H]``: ``[N, H]`` (None without shared experts)."""
        return None if self.shared is None else swiglu(x, *self.shared)

    @torch.no_grad()
    def update_expert_bias(self) -> torch.Tensor:
        """Apply the aux-loss-free update from the last forward's global load; returns the bias."""
        if self.last_tokens_per_expert is None:
            raise ValueError("update_expert_bias: run a forward pass first")
        new = update_expert_bias(
            self.expert_bias, self.last_tokens_per_expert, self.config.bias_update_rate
        )
        self.expert_bias.copy_(new)
        return self.expert_bias

    def expert_parameters(self) -> list[nn.Parameter]:
        """The parameters of this rank's routed experts (not router, not shared experts)."""
        if self.experts is not None:
            return list(self.experts.parameters())
        return [self.w_gate, self.w_up, self.w_down]

    def run_experts(
        self, recv_x: torch.Tensor, local_ids: torch.Tensor, weights: torch.Tensor
    ) -> torch.Tensor:
        """This rank's experts on the received rows: ``[M, H]`` -> ``[M, H]``, always joined to
        ``recv_x``'s autograd graph so that every rank reaches the backward's collectives.
        """
        if self.experts is None:
            out = apply_experts(recv_x, local_ids, weights, self.w_gate, self.w_up, self.w_down)
        else:
            out = self.experts(recv_x, local_ids, weights)
            check_expert_output(self.experts, recv_x, out)
        if torch.is_grad_enabled() and recv_x.requires_grad and not out.requires_grad:
            out = out + recv_x[:0].sum()  # adds 0, links the graph
        return out

    def dispatch_experts_combine(
        self,
        x: torch.Tensor,
        topk_idx: torch.Tensor,
        topk_weights: torch.Tensor,
        *,
        num_experts: int,
        recv_stats: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Routed part of the layer: ``x [N, H]`` -> ``(out [N, H], load [num_experts])``.

        Dispatch by ``topk_idx [N, K]``, run the local experts weighted by ``topk_weights [N, K]``,
        combine, and all-gather every expert's received-token count (``recv_stats`` accumulates the
        local counts).
        """
        res = self.buffer.dispatch(
            x,
            topk_idx,
            topk_weights,
            num_experts=num_experts,
            cumulative_local_expert_recv_stats=recv_stats,
        )
        # a fresh (not cached) dispatch with weights returns both
        assert res.recv_topk_idx is not None and res.recv_topk_weights is not None
        expert_out = self.run_experts(
            res.recv_x, res.recv_topk_idx, res.recv_topk_weights
        )  # (M, H)
        out = self.buffer.combine(expert_out, res.handle).combined_x  # (N, H)
        local_load = torch.tensor(res.handle.num_recv_tokens_per_expert, dtype=torch.int64)
        load = self.buffer.transport.all_gather(local_load.to(x.device), kind="load")  # (E,)
        return out, load

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``[..., H]`` -> ``[..., H]``."""
        shape = x.shape
        x = x.reshape(-1, shape[-1])  # (N, H)
        routing = self.route(x)
        out, load = self.dispatch_experts_combine(
            x, routing.topk_idx, routing.topk_weights, num_experts=self.config.num_experts
        )
        self.last_tokens_per_expert = load  # (E,) in expert order: rank r holds experts r*L..
        shared = self.shared_out(x)
        if shared is not None:
            out = out + shared
        return out.reshape(shape)
