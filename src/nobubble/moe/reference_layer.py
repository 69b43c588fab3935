"""The MoE layer the slow way: token by token, slot by slot, sharing no code with the layer.

The reference for :class:`~nobubble.moe.layer.MoELayer` and
:class:`~nobubble.moe.balance.replicated_layer.ReplicatedMoELayer`. Per token ``x``: logits
``l = W_r x``; routing ``"softmax"`` (the ``K`` largest ``p = softmax(l)``, weighted by ``p``,
not renormalised) or ``"deepseek_v3"`` (arXiv:2412.19437, 2.1.2: ``s = sigmoid(l)``, ``b = s +
bias`` chooses; a group scores the sum of its two highest ``b``; the ``K`` highest ``b`` in the
``topk_groups`` best groups, weighted ``s_e / sum_chosen s * route_scale``); then ``y = sum_k
w_k * W_d,e_k (silu(W_g,e_k x) * (W_u,e_k x))`` plus the shared experts. The bias moves by
``rate * sign(mean load - load)``. All but the top-k choice is differentiable.

It imports nothing from ``nobubble.moe``, so a fast-path mistake cannot cancel against itself.
Ties break by expert id here (arbitrarily in ``torch.topk``): compare on random weights. Math
in the inputs' dtype, float32 at least.

Shape legend: ``N`` tokens, ``H`` hidden, ``I`` expert hidden, ``E`` logical experts, ``R``
physical experts (replicas), ``K`` top-k, ``S`` shared width (shared experts x ``I``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch import nn

__all__ = [
    "RoutingRule",
    "ReferenceOutput",
    "reference_route",
    "reference_expert",
    "reference_moe_forward",
    "reference_bias_update",
    "ReferenceMoE",
]

ROUTER_KINDS = ("softmax", "deepseek_v3")


class RoutingRule(Protocol):
    """How tokens pick experts; :class:`~nobubble.moe.layer.MoEConfig` is one."""

    @property
    def num_experts(self) -> int: ...
    @property
    def topk(self) -> int: ...
    @property
    def router(self) -> str: ...
    @property
    def n_groups(self) -> int: ...
    @property
    def topk_groups(self) -> int: ...
    @property
    def route_scale(self) -> float: ...


@dataclass(frozen=True, eq=False)
class ReferenceOutput:
    """What the reference computed for ``N`` tokens.

    Attributes:
        out: ``[N, H]`` the layer's output.
        topk_idx: ``[N, K]`` int64 logical experts, in the order they were chosen.
        topk_weights: ``[N, K]`` their weights (differentiable).
        tokens_per_expert: ``[E]`` int64 (token, slot) pairs per logical expert.
        tokens_per_replica: ``[R]`` int64 pairs per physical expert (None without replicas).
    """

    out: torch.Tensor
    topk_idx: torch.Tensor
    topk_weights: torch.Tensor
    tokens_per_expert: torch.Tensor
    tokens_per_replica: torch.Tensor | None


def _check_rule(rule: RoutingRule) -> None:
    e, k, g = rule.num_experts, rule.topk, rule.n_groups
    if rule.router not in ROUTER_KINDS:
        raise ValueError(f"reference: router={rule.router!r}; choose one of {ROUTER_KINDS}")
    if not 1 <= k <= e or g < 1 or e % g or not 1 <= rule.topk_groups <= g:
        raise ValueError(
            f"reference: need 1 <= topk={k} <= num_experts={e}, n_groups={g} dividing it and "
            f"1 <= topk_groups={rule.topk_groups} <= n_groups"
        )


def reference_route(
    logits: torch.Tensor, rule: RoutingRule, bias: torch.Tensor | None = None
) -> tuple[list[int], torch.Tensor]:
    """One token's routing: ``logits [E]`` -> (``K`` chosen experts, their weights ``[K]``).

    ``bias [E]`` (DeepSeek-V3 only) steers the choice and never the weights. Experts come in
    the order they were chosen (highest score first); equal scores go to the lower id.
    """
    num_experts, k = rule.num_experts, rule.topk
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))  # (E,) bf16: float32
    if rule.router == "softmax":
        z = torch.exp(logits - logits.max().detach())  # (E,) shifted: exp cannot overflow
        p = z / z.sum()  # (E,)
        prob = p.tolist()
        chosen = sorted(range(num_experts), key=lambda e: -prob[e])[:k]
        return chosen, p[chosen]  # (K,)
    s = torch.sigmoid(logits)  # (E,) 1 / (1 + exp(-l))
    biased = s.detach() if bias is None else s.detach() + bias.to(s.dtype)  # (E,) choice only
    b = biased.tolist()
    per_group = num_experts // rule.n_groups
    group_score = []
    for g in range(rule.n_groups):
        members = sorted(b[g * per_group : (g + 1) * per_group], reverse=True)
        group_score.append(sum(members[:2]))  # its two best (its only one, if alone)
    groups = sorted(range(rule.n_groups), key=lambda g: -group_score[g])[: rule.topk_groups]
    eligible = [e for e in range(num_experts) if e // per_group in groups]
    if len(eligible) < k:
        raise ValueError(
            f"reference: topk={k} exceeds the {len(eligible)} experts of topk_groups="
            f"{rule.topk_groups} groups of {per_group}"
        )
    chosen = sorted(eligible, key=lambda e: -b[e])[:k]
    picked = s[chosen]  # (K,) unbiased
    return chosen, picked / picked.sum() * rule.route_scale


def reference_expert(
    x: torch.Tensor, w_gate: torch.Tensor, w_up: torch.Tensor, w_down: torch.Tensor
) -> torch.Tensor:
    """One SwiGLU expert on one token: ``W_d (silu(W_g x) * (W_u x))``, ``[H]`` -> ``[H]``.

    ``w_gate, w_up [I, H]``, ``w_down [H, I]`` (any ``I``: a shared expert's ``S`` too).
    """
    g = w_gate @ x  # (I,)
    return w_down @ (g * torch.sigmoid(g) * (w_up @ x))  # silu(g) = g * sigmoid(g)


def _replicas(
    phy2log: torch.Tensor | None, physical_idx: torch.Tensor | None, num_tokens: int, k: int
) -> tuple[list[int] | None, list[list[int]] | None]:
    """``phy2log [R]`` and ``physical_idx [N, K]`` as lists (both None without replicas)."""
    if (phy2log is None) != (physical_idx is None):
        raise ValueError("reference: give phy2log and physical_idx together, or neither")
    if phy2log is None or physical_idx is None:
        return None, None
    if physical_idx.shape != (num_tokens, k):
        raise ValueError(
            f"reference: physical_idx.shape={tuple(physical_idx.shape)}, want ({num_tokens}, {k})"
        )
    return [int(e) for e in phy2log.tolist()], physical_idx.tolist()


def reference_moe_forward(
    x: torch.Tensor,
    *,
    rule: RoutingRule,
    router: torch.Tensor,
    w_gate: torch.Tensor,
    w_up: torch.Tensor,
    w_down: torch.Tensor,
    expert_bias: torch.Tensor | None = None,
    shared: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
    phy2log: torch.Tensor | None = None,
    physical_idx: torch.Tensor | None = None,
) -> ReferenceOutput:
    """The MoE layer on ``x [N, H]``, one token at a time (see the module docstring).

    Args:
        x: ``[N, H]`` tokens.
        rule: routing (``num_experts`` = ``E``, ``topk``, ``router``, groups, ``route_scale``).
        router: ``[E, H]``.
        w_gate, w_up: ``[E, I, H]``; w_down: ``[E, H, I]``. With replicas, ``[R, ...]``: one
            slice per physical expert.
        expert_bias: ``[E]`` DeepSeek-V3 selection bias (None: zero).
        shared: ``(gate [S, H], up [S, H], down [H, S])`` of the shared experts, or None.
        phy2log: ``[R]`` int64 logical expert of each physical expert (replicas), or None.
        physical_idx: ``[N, K]`` int64 physical expert that served each slot (what the layer's
            replica routing chose); required with ``phy2log``. A slot routed to logical
            expert ``e`` must be served by a replica of ``e``; it then uses that replica's
            weights, so the weights' gradients are per replica.
    """
    _check_rule(rule)
    num_tokens, k = x.shape[0], rule.topk
    replica_of, served = _replicas(phy2log, physical_idx, num_tokens, k)
    load = [0] * rule.num_experts
    replica_load = [0] * (w_gate.shape[0] if replica_of is None else len(replica_of))
    # unbind once: indexing a tensor per token would make its backward add a zero-padded
    # copy of the whole tensor per token (slow; the same numbers)
    tokens = x.unbind(0)  # N x (H,)
    gates, ups, downs = w_gate.unbind(0), w_up.unbind(0), w_down.unbind(0)  # E (or R) each
    rows, idx_rows, weight_rows = [], [], []
    for t, xt in enumerate(tokens):
        chosen, weights = reference_route(router @ xt, rule, expert_bias)  # K ids, (K,)
        y = x.new_zeros(x.shape[1])  # (H,)
        for slot, e in enumerate(chosen):
            p = e if served is None else served[t][slot]
            if replica_of is not None and not (0 <= p < len(replica_of) and replica_of[p] == e):
                raise ValueError(
                    f"reference: token {t} slot {slot} routed to logical expert {e} was "
                    f"served by physical expert {p}, not one of its replicas"
                )
            y = y + weights[slot].to(x.dtype) * reference_expert(xt, gates[p], ups[p], downs[p])
            load[e] += 1
            replica_load[p] += 1
        if shared is not None:
            y = y + reference_expert(xt, *shared)
        rows.append(y)
        idx_rows.append(chosen)
        weight_rows.append(weights)
    return ReferenceOutput(
        out=torch.stack(rows) if rows else x.new_zeros(0, x.shape[1]),  # (N, H)
        topk_idx=torch.tensor(idx_rows, dtype=torch.int64).view(num_tokens, k),
        topk_weights=torch.stack(weight_rows) if weight_rows else x.new_zeros(0, k),
        tokens_per_expert=torch.tensor(load, dtype=torch.int64),
        tokens_per_replica=None if replica_of is None else torch.tensor(replica_load),
    )


def reference_bias_update(
    bias: torch.Tensor, tokens_per_expert: torch.Tensor, rate: float
) -> torch.Tensor:
    """Aux-loss-free step, expert by expert: ``bias_e + rate * sign(mean load - load_e)``.

    ``bias [E]`` (its dtype kept), ``tokens_per_expert [E]``; returns a new ``[E]`` tensor.
    """
    loads = [int(n) for n in tokens_per_expert]
    mean = sum(loads) / len(loads)
    step = torch.tensor(rate, dtype=bias.dtype)
    new = []
    for e, n in enumerate(loads):
        direction = 1.0 if n < mean else -1.0 if n > mean else 0.0
        new.append(bias[e] + step * direction)
    return torch.stack(new)


class ReferenceMoE(nn.Module):
    """:func:`reference_moe_forward` as a module that trains: one process, every expert.

    Args:
        config: the layer's shape and routing (a :class:`~nobubble.moe.layer.MoEConfig`, or
            anything with its fields: the routing rule, ``bias_update_rate``).
        weights: every expert's weights (a :class:`~nobubble.moe.layer.MoEWeights`, or
            anything with ``router``, ``w_gate``, ``w_up``, ``w_down``, ``shared_gate``,
            ``shared_up``, ``shared_down``, ``expert_bias``); copied.

    Parameters ``router [E, H]``, ``w_gate, w_up [E, I, H]``, ``w_down [E, H, I]``, and
    ``shared_gate, shared_up [S, H]``, ``shared_down [H, S]`` when there are shared experts;
    buffer ``expert_bias [E]``. Like the layer: ``last_tokens_per_expert`` after a forward,
    :meth:`update_expert_bias` after a step.
    """

    expert_bias: torch.Tensor  # a buffer (register_buffer), for the type checker

    def __init__(self, config: Any, weights: Any) -> None:
        super().__init__()
        _check_rule(config)
        self.config = config
        self.router = nn.Parameter(weights.router.detach().clone())  # (E, H)
        self.w_gate = nn.Parameter(weights.w_gate.detach().clone())  # (E, I, H)
        self.w_up = nn.Parameter(weights.w_up.detach().clone())  # (E, I, H)
        self.w_down = nn.Parameter(weights.w_down.detach().clone())  # (E, H, I)
        self.shared_gate: nn.Parameter | None = None
        self.shared_up: nn.Parameter | None = None
        self.shared_down: nn.Parameter | None = None
        if weights.shared_gate is not None:
            self.shared_gate = nn.Parameter(weights.shared_gate.detach().clone())  # (S, H)
            self.shared_up = nn.Parameter(weights.shared_up.detach().clone())  # (S, H)
            self.shared_down = nn.Parameter(weights.shared_down.detach().clone())  # (H, S)
        self.register_buffer("expert_bias", weights.expert_bias.detach().clone())  # (E,)
        self.last_tokens_per_expert: torch.Tensor | None = None
        self.last: ReferenceOutput | None = None
        self.last_replica_weights: tuple[torch.Tensor, ...] | None = None

    def forward(
        self,
        x: torch.Tensor,
        *,
        phy2log: torch.Tensor | None = None,
        physical_idx: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """``[..., H]`` -> ``[..., H]``.

        With ``phy2log [R]`` and ``physical_idx [N, K]`` (see :func:`reference_moe_forward`)
        every physical expert is a copy of its logical one (``w[phy2log]``, differentiable:
        the logical gradient is the sum over its replicas), and
        :attr:`last_replica_weights` holds the ``[R, ...]`` copies, whose ``.grad`` after
        backward is each replica's own gradient.
        """
        shape = x.shape
        flat = x.reshape(-1, shape[-1])  # (N, H)
        experts: tuple[torch.Tensor, ...] = (self.w_gate, self.w_up, self.w_down)
        self.last_replica_weights = None
        if phy2log is not None:
            experts = tuple(w[phy2log.long()] for w in experts)  # (R, ...) replica copies
            for w in experts:
                if w.requires_grad:
                    w.retain_grad()
            self.last_replica_weights = experts
        shared = None
        if self.shared_gate is not None:
            assert self.shared_up is not None and self.shared_down is not None  # set together
            shared = (self.shared_gate, self.shared_up, self.shared_down)
        res = reference_moe_forward(
            flat,
            rule=self.config,
            router=self.router,
            w_gate=experts[0],
            w_up=experts[1],
            w_down=experts[2],
            expert_bias=self.expert_bias,
            shared=shared,
            phy2log=phy2log,
            physical_idx=physical_idx,
        )
        self.last = res
        self.last_tokens_per_expert = res.tokens_per_expert
        return res.out.reshape(shape)

    @torch.no_grad()
    def update_expert_bias(self) -> torch.Tensor:
        """The aux-loss-free step from the last forward's load; returns the new bias."""
        if self.last_tokens_per_expert is None:
            raise ValueError("ReferenceMoE.update_expert_bias: run a forward pass first")
        new = reference_bias_update(
            self.expert_bias, self.last_tokens_per_expert, self.config.bias_update_rate
        )
        self.expert_bias.copy_(new)
        return self.expert_bias
