"""Dispatch layout: which rank each token goes to, and how many tokens each expert gets.

Rank ``r`` owns experts ``[r * E / R, (r + 1) * E / R)``. A token is sent to a rank once however
many of its experts live there, so ``num_tokens_per_rank`` counts tokens and
``num_tokens_per_expert`` top-k slots. Also the static shape of expert parallelism
(:class:`MoEConfig`, :func:`num_local_experts`, the router and transport kinds), without a
module-level torch import, so the command line checks a shape before importing torch.

Shape legend: ``N`` tokens on this rank, ``K`` top-k slots, ``E`` experts, ``R`` ranks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from nobubble.validation import check_fields

if TYPE_CHECKING:
    import torch

__all__ = ["DispatchLayout", "get_dispatch_layout", "check_topk_idx", "num_local_experts",
           "MoEConfig", "ROUTERS", "TRANSPORT_KINDS"]  # fmt: skip

ROUTERS = ("softmax", "deepseek_v3")
TRANSPORT_KINDS = ("auto", "shm", "dist")


@dataclass(frozen=True, eq=False)
class DispatchLayout:
    """The routing summary that :meth:`Buffer.dispatch` needs before moving any payload.

    Attributes:
        num_tokens_per_rank: ``[R]`` int64, tokens this rank sends to each rank (deduplicated).
        num_tokens_per_expert: ``[E]`` int64, top-k slots of this rank's tokens per expert.
        is_token_in_rank: ``[N, R]`` bool, True where token ``n`` has an expert on rank ``r``.
    """

    num_tokens_per_rank: torch.Tensor
    num_tokens_per_expert: torch.Tensor
    is_token_in_rank: torch.Tensor

    @property
    def num_ranks(self) -> int:
        return int(self.is_token_in_rank.shape[1])

    @property
    def num_experts(self) -> int:
        return int(self.num_tokens_per_expert.shape[0])


@dataclass(frozen=True, kw_only=True)
class MoEConfig:
    """Shape and routing of one MoE layer."""

    hidden: int
    """``H``, model width."""
    expert_hidden: int
    """``I``, intermediate width of one routed expert."""
    num_experts: int
    """``E``, routed experts (a multiple of the expert-parallel ranks)."""
    topk: int
    """``K``, routed experts per token."""
    num_shared_experts: int = 0
    """Shared experts every token goes through (fused into one SwiGLU of width S * I)."""
    router: str = "softmax"
    """``"softmax"`` (top-k of softmax) or ``"deepseek_v3"`` (group-limited sigmoid gating)."""
    n_groups: int = 1
    """DeepSeek-V3 expert groups."""
    topk_groups: int = 1
    """DeepSeek-V3 groups each token may use."""
    route_scale: float = 1.0
    """DeepSeek-V3 weight scale after normalisation."""
    bias_update_rate: float = 0.001
    """Aux-loss-free bias step (DeepSeek-V3's gamma)."""

    def __post_init__(self) -> None:
        check_fields("MoEConfig", self, ("hidden", "expert_hidden", "num_experts", "topk"), ">= 1")
        if self.topk > self.num_experts:
            raise ValueError(f"MoEConfig: topk={self.topk} exceeds num_experts={self.num_experts}")
        if self.num_shared_experts < 0:
            raise ValueError(
                f"MoEConfig: num_shared_experts={self.num_shared_experts} must be >= 0"
            )
        if self.router not in ROUTERS:
            raise ValueError(f"MoEConfig: router={self.router!r}; choose one of {ROUTERS}")
        if self.num_experts % self.n_groups != 0 or not 1 <= self.topk_groups <= self.n_groups:
            raise ValueError(
                f"MoEConfig: n_groups={self.n_groups} must divide num_experts={self.num_experts} "
                f"and 1 <= topk_groups={self.topk_groups} <= n_groups"
            )


def num_local_experts(num_experts: int, num_ranks: int) -> int:
    """Experts per rank; raises ValueError unless ``num_experts`` is a positive multiple of ranks."""
    if num_ranks < 1:
        raise ValueError(f"num_ranks={num_ranks} must be >= 1")
    if num_experts < 1 or num_experts % num_ranks != 0:
        raise ValueError(
            f"num_experts={num_experts} must be a positive multiple of num_ranks={num_ranks} "
            f"(experts are split evenly over ranks); use e.g. {max(1, num_experts // num_ranks) * num_ranks}"
        )
    return num_experts // num_ranks


def check_topk_idx(topk_idx: torch.Tensor, num_experts: int, *, name: str = "topk_idx") -> None:
    """Raise ValueError unless ``topk_idx`` is an ``[N, K]`` integer tensor with values in [-1, E)."""
    import torch

    if not isinstance(topk_idx, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(topk_idx).__name__}")
    if topk_idx.dtype not in (torch.int64, torch.int32):
        raise ValueError(f"{name}.dtype={topk_idx.dtype}; use torch.int64 (expert ids, -1 = none)")
    if topk_idx.dim() != 2 or topk_idx.shape[1] < 1:
        raise ValueError(f"{name}.shape={tuple(topk_idx.shape)}; expected [num_tokens, topk>=1]")
    if topk_idx.numel():
        lo, hi = int(topk_idx.min()), int(topk_idx.max())
        if lo < -1 or hi >= num_experts:
            bad = lo if lo < -1 else hi
            raise ValueError(
                f"{name} holds expert id {bad}, outside [-1, {num_experts}) for "
                f"num_experts={num_experts}; use -1 for an empty slot"
            )


def get_dispatch_layout(topk_idx: torch.Tensor, num_experts: int, num_ranks: int) -> DispatchLayout:
    """Count tokens per rank and per expert for a routing decision.

    Args:
        topk_idx: ``[N, K]`` int64 expert ids per token, ``-1`` for an empty slot.
        num_experts: ``E``, a multiple of ``num_ranks``.
        num_ranks: ``R``.
    Returns:
        A :class:`DispatchLayout` on ``topk_idx``'s device.
    """
    import torch

    experts_per_rank = num_local_experts(num_experts, num_ranks)
    check_topk_idx(topk_idx, num_experts)
    topk_idx = topk_idx.long()
    num_tokens = topk_idx.shape[0]
    valid = topk_idx >= 0  # (N, K)
    # Empty slots point at a spare column R that is dropped afterwards.
    rank_idx = torch.where(valid, topk_idx // experts_per_rank, num_ranks)  # (N, K)
    hits = torch.zeros(num_tokens, num_ranks + 1, dtype=torch.bool, device=topk_idx.device)
    hits.scatter_(1, rank_idx, True)
    is_token_in_rank = hits[:, :num_ranks].contiguous()  # (N, R)
    num_tokens_per_rank = is_token_in_rank.sum(dim=0, dtype=torch.int64)  # (R,)
    num_tokens_per_expert = torch.bincount(topk_idx[valid], minlength=num_experts)  # (E,)
    return DispatchLayout(
        num_tokens_per_rank=num_tokens_per_rank,
        num_tokens_per_expert=num_tokens_per_expert.to(torch.int64),
        is_token_in_rank=is_token_in_rank,
    )
