"""Routers: softmax top-k and DeepSeek-V3's group-limited sigmoid gating.

DeepSeek-V3 (arXiv:2412.19437, section 2.1.2) scores experts with a sigmoid, selects the
top-k among *biased* scores ``s + b`` restricted to the ``topk_groups`` best expert groups (a
group's score is the sum of its two highest biased scores; with one group per node this is
node-limited routing), and weights the chosen experts by their *unbiased* scores, normalised
to sum to one and scaled by ``route_scale``. The bias ``b`` steers selection only; after each
step it moves by ``rate * sign(mean_load - load)`` (auxiliary-loss-free load balancing).

Shape legend: ``N`` tokens, ``E`` experts, ``K`` top-k, ``G`` groups.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["Routing", "softmax_topk", "deepseek_v3_topk", "update_expert_bias"]


@dataclass(frozen=True, eq=False)
class Routing:
    """A routing decision.

    Attributes:
        topk_idx: ``[N, K]`` int64 chosen experts.
        topk_weights: ``[N, K]`` their weights (differentiable w.r.t. the logits).
        scores: ``[N, E]`` the router's scores (softmax probabilities or sigmoids).
    """

    topk_idx: torch.Tensor
    topk_weights: torch.Tensor
    scores: torch.Tensor


def _check_logits(logits: torch.Tensor, topk: int) -> None:
    if not isinstance(logits, torch.Tensor) or logits.dim() != 2 or not logits.is_floating_point():
        raise ValueError("router: logits must be a floating [num_tokens, num_experts] tensor")
    if not 1 <= topk <= logits.shape[1]:
        raise ValueError(f"router: topk={topk} must be in [1, num_experts={logits.shape[1]}]")


def _scores_dtype(logits: torch.Tensor) -> torch.dtype:
    """Scores run in float32 at least (bf16/fp16 logits), in float64 for float64 logits."""
    return torch.promote_types(logits.dtype, torch.float32)


def softmax_topk(logits: torch.Tensor, topk: int, *, normalize: bool = False) -> Routing:
    """Softmax over experts, keep the top-k probabilities (renormalised when ``normalize``)."""
    _check_logits(logits, topk)
    scores = logits.to(_scores_dtype(logits)).softmax(dim=-1)  # (N, E)
    topk_weights, topk_idx = scores.topk(topk, dim=-1)  # (N, K)
    if normalize:
        topk_weights = topk_weights / topk_weights.sum(dim=-1, keepdim=True)
    return Routing(topk_idx, topk_weights, scores)


def deepseek_v3_topk(
    logits: torch.Tensor,
    topk: int,
    *,
    n_groups: int = 1,
    topk_groups: int = 1,
    bias: torch.Tensor | None = None,
    route_scale: float = 1.0,
) -> Routing:
    """DeepSeek-V3 gating: sigmoid scores, group-limited biased selection, normalised weights.

    Args:
        logits: ``[N, E]``.
        topk: experts per token.
        n_groups: ``G``, E must be a multiple of it.
        topk_groups: groups a token may use.
        bias: ``[E]`` selection bias (aux-loss-free balancing), not differentiated.
        route_scale: weights are multiplied by this after normalisation.
    """
    _check_logits(logits, topk)
    num_tokens, num_experts = logits.shape
    if n_groups < 1 or num_experts % n_groups != 0:
        raise ValueError(
            f"router: num_experts={num_experts} is not a multiple of n_groups={n_groups}"
        )
    if not 1 <= topk_groups <= n_groups:
        raise ValueError(f"router: topk_groups={topk_groups} must be in [1, n_groups={n_groups}]")
    per_group = num_experts // n_groups
    if topk > topk_groups * per_group:
        raise ValueError(
            f"router: topk={topk} exceeds the {topk_groups * per_group} experts in "
            f"topk_groups={topk_groups} groups of {per_group}; raise topk_groups"
        )
    scores = logits.to(_scores_dtype(logits)).sigmoid()  # (N, E)
    biased = scores.detach()
    if bias is not None:
        if bias.shape != (num_experts,):
            raise ValueError(f"router: bias.shape={tuple(bias.shape)} must be ({num_experts},)")
        biased = biased + bias.to(scores.dtype)
    if n_groups > 1:
        grouped = biased.view(num_tokens, n_groups, per_group)  # (N, G, E/G)
        group_scores = grouped.topk(min(2, per_group), dim=-1).values.sum(dim=-1)  # (N, G)
        top_groups = group_scores.topk(topk_groups, dim=-1).indices  # (N, topk_groups)
        group_mask = torch.zeros_like(group_scores, dtype=torch.bool).scatter_(1, top_groups, True)
        expert_mask = group_mask.repeat_interleave(per_group, dim=1)  # (N, E)
        biased = biased.masked_fill(~expert_mask, float("-inf"))
    topk_idx = biased.topk(topk, dim=-1).indices  # (N, K)
    topk_weights = scores.gather(1, topk_idx)  # (N, K), unbiased
    topk_weights = topk_weights / topk_weights.sum(dim=-1, keepdim=True) * route_scale
    return Routing(topk_idx, topk_weights, scores)


def update_expert_bias(
    bias: torch.Tensor, tokens_per_expert: torch.Tensor, rate: float
) -> torch.Tensor:
    """Aux-loss-free update: ``bias + rate * sign(mean_load - load)`` (a new tensor).

    Args:
        bias: ``[E]``.
        tokens_per_expert: ``[E]`` load of the last step, summed over all ranks.
        rate: the update speed ``gamma`` (DeepSeek-V3 uses 0.001).
    """
    if tokens_per_expert.shape != bias.shape:
        raise ValueError(
            f"update_expert_bias: tokens_per_expert.shape={tuple(tokens_per_expert.shape)} "
            f"must equal bias.shape={tuple(bias.shape)}"
        )
    if rate < 0:
        raise ValueError(f"update_expert_bias: rate={rate} must be >= 0")
    load = tokens_per_expert.to(torch.float64)
    return bias + rate * torch.sign(load.mean() - load).to(bias.dtype)
