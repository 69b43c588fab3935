"""Policy-gradient losses: GRPO advantages, PPO clip (dual clip; decoupled PPO), plain PG, KL
penalties, and their one aggregation (:func:`aggregate_loss`, verl's ``agg_loss``).

Shapes: ``B`` responses by ``T`` tokens; per-token tensors and ``mask`` (bool or 0/1, the tokens
that count) are ``(B, T)``; per-response ones may be ``(B,)``, broadcast over tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

import torch

__all__ = [
    "GRPOScale",
    "grpo_advantages",
    "LossAgg",
    "LOSS_AGG_MODES",
    "PolicyLossResult",
    "aggregate_loss",
    "ppo_policy_loss",
    "policy_gradient_loss",
    "kl_penalty",
    "policy_entropy",
]

LossAgg = Literal[
    "token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"
]
LOSS_AGG_MODES: tuple[str, ...] = get_args(LossAgg)
KLKind = Literal["k1", "k2", "k3"]


@dataclass(frozen=True)
class PolicyLossResult:
    """A policy ``loss`` (scalar with gradient, to ``backward``) and detached means over the
    valid tokens: ``clip_fraction`` (clipped branch active: zero gradient),
    ``dual_clip_fraction`` (``A < 0`` and loss capped at ``c |A|``), ``approx_kl`` (k3,
    ``E[(r - 1) - log r] >= 0``, ``r = pi / pi_old``) and ``behav_weight_mean`` (the per-token
    weights' mean: truncated ``pi_prox / pi_behav`` times ``weights``; None without either).
    """

    loss: torch.Tensor
    clip_fraction: torch.Tensor
    dual_clip_fraction: torch.Tensor
    approx_kl: torch.Tensor
    behav_weight_mean: torch.Tensor | None = None


def _check_mask(logp: torch.Tensor, mask: torch.Tensor, who: str) -> torch.Tensor:
    if logp.dim() != 2 or mask.shape != logp.shape:
        raise ValueError(
            f"{who}: logp {tuple(logp.shape)} and mask {tuple(mask.shape)} must both be (B, T)"
        )
    return mask.to(logp.dtype)


def _per_token(x: torch.Tensor, like: torch.Tensor, name: str, who: str) -> torch.Tensor:
    """Broadcast a ``(B,)`` sequence-level tensor to ``(B, T)``; pass ``(B, T)`` through."""
    if x.shape == like.shape:
        return x
    if x.dim() == 1 and x.shape[0] == like.shape[0]:
        return x.unsqueeze(1).expand_as(like)  # (B, 1) -> (B, T)
    raise ValueError(
        f"{who}: {name} has shape {tuple(x.shape)}; pass (B,) = ({like.shape[0]},) or "
        f"(B, T) = {tuple(like.shape)}"
    )


def aggregate_loss(
    loss_mat: torch.Tensor,
    mask: torch.Tensor,
    agg: LossAgg = "token-mean",
    *,
    global_num_tokens: float | torch.Tensor | None = None,
    global_num_seqs: float | torch.Tensor | None = None,
    norm_length: float | None = None,
) -> torch.Tensor:
    """Reduce a ``(B, T)`` float per-token loss to a 0-dim tensor (0 without valid tokens).

    ``agg`` (:data:`LOSS_AGG_MODES`): ``token-mean``: valid-token sum / ``global_num_tokens``
    (default: the valid tokens here; the global batch's count makes micro-batch losses sum to
    the batch's); ``seq-mean-token-mean``: mean of each sequence's token mean;
    ``seq-mean-token-sum``: mean of token sums; ``seq-mean-token-sum-norm`` (Dr. GRPO): mean of
    token sums / ``norm_length`` (default ``T``, > 0). The ``seq-mean-*`` means divide by
    ``global_num_seqs`` (default: the sequences with a valid token).
    """
    mask = _check_mask(loss_mat, mask, "aggregate_loss")
    if agg not in LOSS_AGG_MODES:
        raise ValueError(f"aggregate_loss: agg={agg!r}; use one of {LOSS_AGG_MODES}")
    token_sum = (loss_mat * mask).sum(dim=1)  # (B,)
    tokens_per_seq = mask.sum(dim=1)  # (B,)
    if agg == "token-mean":
        total = token_sum.sum()
        denom = mask.sum() if global_num_tokens is None else global_num_tokens
    else:
        length = loss_mat.shape[1] if norm_length is None else norm_length
        if agg == "seq-mean-token-sum-norm" and length <= 0:
            raise ValueError(f"aggregate_loss: norm_length={norm_length} must be > 0")
        per_seq = {
            "seq-mean-token-mean": token_sum / tokens_per_seq.clamp(min=1.0),
            "seq-mean-token-sum": token_sum,
            "seq-mean-token-sum-norm": token_sum / length,
        }[agg]
        total = per_seq.sum()
        denom = (tokens_per_seq > 0).sum() if global_num_seqs is None else global_num_seqs
    denom = torch.as_tensor(denom, dtype=loss_mat.dtype, device=loss_mat.device)
    return total / denom.clamp(min=1.0)


def ppo_policy_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    dual_clip: float | None = None,
    agg: LossAgg = "token-mean",
    *,
    weights: torch.Tensor | None = None,
    behav_logp: torch.Tensor | None = None,
    behav_weight_cap: float | None = 5.0,
    behav_weight_mode: Literal["truncate", "mask"] = "truncate",
    global_num_tokens: float | torch.Tensor | None = None,
    global_num_seqs: float | torch.Tensor | None = None,
    norm_length: float | None = None,
) -> PolicyLossResult:
    """PPO's clipped policy loss (Schulman et al., 2017), decoupled (Hilton et al., 2022; AReaL)
    when ``behav_logp`` is given: per token, ``r = pi / pi_old`` and

        loss = w * max(-A r, -A clip(r, 1 - clip_low, 1 + clip_high))

    capped at ``c |A|`` for ``A < 0`` with ``dual_clip = c > 1`` (Ye et al., 2020; None = off);
    a token where the clipped branch wins has zero gradient. Only ``logp`` ``(B, T)`` carries
    gradient; ``old_logp`` (the proximal policy under decoupled PPO), ``advantages``, ``weights``
    and ``behav_logp`` are ``(B, T)`` or ``(B,)``. ``w = weights * pi_old / pi_behav``, the
    latter truncated at ``behav_weight_cap`` (> 0; None = not) or, ``behav_weight_mode="mask"``,
    its tokens above the cap dropped (``behav_logp == old_logp``: plain PPO). ``agg`` and the
    rest: :func:`aggregate_loss`.
    """
    who = "ppo_policy_loss"
    if not 0.0 <= clip_low < 1.0:
        raise ValueError(f"{who}: clip_low={clip_low} must be in [0, 1) (ratio >= 1 - clip_low)")
    if clip_high < 0.0:
        raise ValueError(f"{who}: clip_high={clip_high} must be >= 0 (ratio <= 1 + clip_high)")
    if dual_clip is not None and dual_clip <= 1.0:
        raise ValueError(f"{who}: dual_clip={dual_clip} must be > 1 (e.g. 3.0) or None")
    mask = _check_mask(logp, mask, who)
    old_logp = _per_token(old_logp, logp, "old_logp", who).detach()
    advantages = _per_token(advantages, logp, "advantages", who).detach()
    weights, mask = _token_weights(
        old_logp, weights, behav_logp, mask, behav_weight_cap, behav_weight_mode, who
    )
    log_ratio = logp - old_logp
    ratio = torch.exp(log_ratio)
    loss_unclipped = -advantages * ratio
    loss_clipped = -advantages * torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)
    loss_mat = torch.maximum(loss_unclipped, loss_clipped)
    is_clipped = loss_clipped > loss_unclipped
    is_dual = torch.zeros_like(is_clipped)
    if dual_clip is not None:
        cap = -advantages * dual_clip  # = c * |A| where A < 0
        is_dual = (advantages < 0) & (loss_mat > cap)
        loss_mat = torch.where(advantages < 0, torch.minimum(loss_mat, cap), loss_mat)
    loss = aggregate_loss(
        loss_mat if weights is None else loss_mat * weights,
        mask,
        agg,
        global_num_tokens=global_num_tokens,
        global_num_seqs=global_num_seqs,
        norm_length=norm_length,
    )
    with torch.no_grad():  # diagnostics: token means over the valid tokens
        return PolicyLossResult(
            loss=loss,
            clip_fraction=aggregate_loss(is_clipped.to(logp.dtype), mask),
            dual_clip_fraction=aggregate_loss(is_dual.to(logp.dtype), mask),
            approx_kl=aggregate_loss((ratio - 1.0) - log_ratio, mask),
            behav_weight_mean=None if weights is None else aggregate_loss(weights, mask),
        )


def _token_weights(
    prox_logp: torch.Tensor,
    weights: torch.Tensor | None,
    behav_logp: torch.Tensor | None,
    mask: torch.Tensor,
    cap: float | None,
    mode: str,
    who: str,
) -> tuple[torch.Tensor | None, torch.Tensor]:
    """PPO's per-token weights ``(B, T)`` (None: all 1) and mask: ``weights`` times, with
    ``behav_logp``, ``pi_prox / pi_behav`` truncated at ``cap`` (or tokens above it masked)."""
    if weights is not None:
        weights = _per_token(weights.detach(), prox_logp, "weights", who)
    if behav_logp is None:
        return weights, mask
    if cap is not None and cap <= 0:
        raise ValueError(f"{who}: behav_weight_cap={cap} must be > 0 or None")
    if mode not in ("truncate", "mask"):
        raise ValueError(f"{who}: behav_weight_mode={mode!r}; use 'truncate' or 'mask'")
    behav_logp = _per_token(behav_logp, prox_logp, "behav_logp", who).detach()
    weight = torch.exp(prox_logp - behav_logp)
    if cap is not None and mode == "truncate":
        weight = weight.clamp(max=cap)
    elif cap is not None:
        keep = weight <= cap
        weight, mask = torch.where(keep, weight, torch.zeros_like(weight)), mask * keep
    return (weight if weights is None else weights * weight), mask


def policy_gradient_loss(
    logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    agg: LossAgg = "token-mean",
    *,
    weights: torch.Tensor | None = None,
    global_num_tokens: float | torch.Tensor | None = None,
    global_num_seqs: float | torch.Tensor | None = None,
    norm_length: float | None = None,
) -> torch.Tensor:
    """REINFORCE-style 0-dim loss ``-w * A * log pi`` (use with V-trace's ``pg_advantages``):
    ``logp`` ``(B, T)`` with gradient; ``advantages``, ``weights`` constants, ``(B, T)`` or
    ``(B,)``; ``agg`` and the rest: :func:`aggregate_loss`."""
    who = "policy_gradient_loss"
    mask = _check_mask(logp, mask, who)
    advantages = _per_token(advantages, logp, "advantages", who).detach()
    loss_mat = -advantages * logp
    if weights is not None:
        loss_mat = loss_mat * _per_token(weights.detach(), logp, "weights", who)
    return aggregate_loss(
        loss_mat,
        mask,
        agg,
        global_num_tokens=global_num_tokens,
        global_num_seqs=global_num_seqs,
        norm_length=norm_length,
    )


def kl_penalty(logp: torch.Tensor, ref_logp: torch.Tensor, kind: KLKind = "k1") -> torch.Tensor:
    """Per-token estimate of KL(pi_theta || pi_ref) from samples of pi_theta (Schulman, 2020),
    shaped like ``logp`` and ``ref_logp`` (a constant), to :func:`aggregate_loss`. With
    ``log_r = ref_logp - logp``: ``k1 = -log_r`` (unbiased, can be negative), ``k2 = log_r**2
    / 2`` (biased, low variance), ``k3 = (exp(log_r) - 1) - log_r`` (unbiased, >= 0)."""
    if logp.shape != ref_logp.shape:
        raise ValueError(
            f"kl_penalty: logp {tuple(logp.shape)} and ref_logp {tuple(ref_logp.shape)} differ"
        )
    if kind not in ("k1", "k2", "k3"):
        raise ValueError(f"kl_penalty: kind={kind!r}; use 'k1', 'k2' or 'k3'")
    log_r = ref_logp.detach() - logp
    if kind == "k1":
        return -log_r
    return 0.5 * log_r.square() if kind == "k2" else torch.expm1(log_r) - log_r


GRPOScale = Literal["group", "batch", "none"]
_SCALES = get_args(GRPOScale)


def grpo_advantages(
    rewards: torch.Tensor,
    group_size: int,
    scale: GRPOScale = "group",
    eps: float = 1e-6,
) -> torch.Tensor:
    """GRPO's group-relative advantages (Shao et al., 2024), ``(N,)`` like ``rewards``
    ``(N = num_groups * group_size,)`` (a prompt's ``group_size`` responses adjacent), no
    gradient: ``A_i = (r_i - mean(r_group)) / (std + eps)`` with the *unbiased* std (verl, TRL:
    ``[1, 0, 0, 1]`` gives ``+-0.866``) of the group (``scale="group"``), of the batch
    (``"batch"``, REINFORCE++) or no division (``"none"``, Dr. GRPO); ``eps > 0``. Flat and
    singleton groups give exactly 0. GAE is :func:`~nobubble.rl.algo.vtrace.vtrace` with
    ``log_rhos = 0``.
    """
    if rewards.dim() != 1:
        raise ValueError(
            f"grpo_advantages: rewards has shape {tuple(rewards.shape)}; pass a 1-D tensor "
            "(num_groups * group_size,) with each group's responses adjacent"
        )
    if group_size < 1 or rewards.numel() % group_size != 0:
        raise ValueError(
            f"grpo_advantages: group_size={group_size} must be >= 1 and divide the number of "
            f"rewards ({rewards.numel()}); drop or pad incomplete groups first"
        )
    if scale not in _SCALES:
        raise ValueError(f"grpo_advantages: scale={scale!r}; use one of {_SCALES}")
    if eps <= 0:
        raise ValueError(f"grpo_advantages: eps={eps} must be > 0")
    rewards = rewards.detach()
    groups = rewards.reshape(-1, group_size)  # (G, group_size)
    centered = groups - groups.mean(dim=1, keepdim=True)  # (G, group_size)
    if group_size == 1:
        return torch.zeros_like(rewards)
    # A group whose rewards are all equal carries no signal. Its mean can still differ from
    # the rewards in the last bit (e.g. 6 * -2.0 + 1.3087), and dividing that rounding error
    # by an equally tiny std would turn it into an advantage of order 1: zero such groups.
    spread = groups.amax(dim=1, keepdim=True) - groups.amin(dim=1, keepdim=True)  # (G, 1)
    tiny = 16 * torch.finfo(groups.dtype).eps * groups.abs().amax(dim=1, keepdim=True)
    centered = torch.where(spread <= tiny, torch.zeros_like(centered), centered)
    if scale == "group":
        centered = centered / (groups.std(dim=1, keepdim=True) + eps)
    elif scale == "batch" and rewards.numel() > 1:
        centered = centered / (rewards.std() + eps)
    return centered.reshape(-1)


def policy_entropy(logp: torch.Tensor) -> torch.Tensor:
    """The entropy ``-sum_a pi(a) log pi(a)`` of each distribution of ``logp`` ``(..., A)``
    (log-probabilities, e.g. ``log_softmax(logits, -1)``): ``(...)``."""
    return -(logp.exp() * logp).sum(-1)
