"""Policy-gradient losses: GRPO advantages, PPO clip (with dual clip; decoupled PPO as an
option), plain PG, KL penalties, and their one aggregation (:func:`aggregate_loss`, verl's
``agg_loss``).

Shapes: ``B`` sequences (responses) by ``T`` tokens. Every per-token tensor is ``(B, T)``;
``mask`` is ``(B, T)`` bool or 0/1 float marking the response tokens that count. Sequence
level quantities (one advantage per response) may be passed as ``(B,)`` and are broadcast
over tokens.
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
]

LossAgg = Literal[
    "token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"
]
LOSS_AGG_MODES: tuple[str, ...] = get_args(LossAgg)
KLKind = Literal["k1", "k2", "k3"]


@dataclass(frozen=True)
class PolicyLossResult:
    """A policy loss and its diagnostics (detached scalars, masked means over valid tokens).

    Attributes:
        loss: scalar with gradient, the aggregated loss to call ``backward`` on.
        clip_fraction: share of tokens where the clipped branch is active (zero gradient).
        dual_clip_fraction: share of tokens capped by the dual clip (A < 0 and loss > c*|A|).
        approx_kl: ``E[(r - 1) - log r]`` with ``r = pi / pi_old`` (Schulman's k3, >= 0).
        behav_weight_mean: mean per-token weight (decoupled PPO's truncated
            ``pi_prox / pi_behav``, or the ``weights`` given to PPO); None without weights.
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
    """Reduce a ``(B, T)`` per-token loss to a scalar.

    Modes: ``token-mean``: sum over valid tokens / number of valid tokens (with
    ``global_num_tokens``, the count over the global batch, micro-batch losses sum to the
    whole batch's); ``seq-mean-token-mean``: each sequence's mean over its tokens, then the
    mean over sequences; ``seq-mean-token-sum``: each sequence's token sum, then the mean;
    ``seq-mean-token-sum-norm``: each sequence's token sum / a constant ``norm_length``, then
    the mean (Dr. GRPO). "Sequences" are those with a valid token, unless
    ``global_num_seqs`` is given.

    Args:
        loss_mat: ``(B, T)`` float per-token losses.
        mask: ``(B, T)`` bool/float, 1 on tokens that count.
        agg: one of :data:`LOSS_AGG_MODES`.
        global_num_tokens: denominator for ``token-mean`` (default: valid tokens here).
        global_num_seqs: denominator for the ``seq-mean-*`` modes.
        norm_length: constant length for ``seq-mean-token-sum-norm`` (default ``T``).
    Returns:
        0-dim tensor; 0 when there are no valid tokens.
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
    return total / torch.as_tensor(denom, dtype=loss_mat.dtype, device=loss_mat.device).clamp(
        min=1.0
    )


def _check_clip(clip_low: float, clip_high: float, dual_clip: float | None, who: str) -> None:
    if not 0.0 <= clip_low < 1.0:
        raise ValueError(f"{who}: clip_low={clip_low} must be in [0, 1) (ratio >= 1 - clip_low)")
    if clip_high < 0.0:
        raise ValueError(f"{who}: clip_high={clip_high} must be >= 0 (ratio <= 1 + clip_high)")
    if dual_clip is not None and dual_clip <= 1.0:
        raise ValueError(f"{who}: dual_clip={dual_clip} must be > 1 (e.g. 3.0) or None")


def _clipped_surrogate(
    ratio: torch.Tensor,
    advantages: torch.Tensor,
    clip_low: float,
    clip_high: float,
    dual_clip: float | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """PPO's pessimistic surrogate per token; returns ``(loss, is_clipped, is_dual_clipped)``.

    ``loss = max(-A r, -A clip(r, 1 - clip_low, 1 + clip_high))`` and, with a dual clip ``c``,
    ``min(loss, c |A|)`` where ``A < 0`` (Ye et al., 2020). Where the clipped (constant)
    branch wins, the token's gradient is exactly zero.
    """
    loss_unclipped = -advantages * ratio
    loss_clipped = -advantages * torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)
    loss = torch.maximum(loss_unclipped, loss_clipped)
    is_clipped = loss_clipped > loss_unclipped
    is_dual = torch.zeros_like(is_clipped)
    if dual_clip is not None:
        cap = -advantages * dual_clip  # = c * |A| where A < 0
        is_dual = (advantages < 0) & (loss > cap)
        loss = torch.where(advantages < 0, torch.minimum(loss, cap), loss)
    return loss, is_clipped, is_dual


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
    """PPO clipped policy loss (Schulman et al., 2017) with asymmetric clip and dual clip,
    and decoupled PPO (Hilton et al., 2022; AReaL, Fu et al., 2025) when ``behav_logp`` is
    given.

    Decoupled PPO centres the trust region on a *proximal* policy (recent weights, passed as
    ``old_logp``) while the data came from an older *behaviour* policy (``behav_logp``). Per
    token:

        loss = w * max(-A r, -A clip(r, 1 - clip_low, 1 + clip_high)),
        r = pi_theta / pi_prox,   w = pi_prox / pi_behav  (truncated at behav_weight_cap)

    With ``behav_weight_mode="mask"`` tokens whose ``w`` exceeds the cap are dropped instead
    (AReaL's behaviour). ``behav_logp == old_logp`` gives back plain PPO (``w = 1``).

    Args:
        logp: ``(B, T)`` log pi_theta(a_t | s_t), with gradient.
        old_logp: ``(B, T)`` log-probs of the policy the ratio is taken against (no grad):
            the behaviour policy, or the proximal one when ``behav_logp`` is given.
        advantages: ``(B, T)`` or ``(B,)`` float.
        mask: ``(B, T)`` valid-token mask.
        clip_low, clip_high: the ratio is clipped to ``[1 - clip_low, 1 + clip_high]``.
        dual_clip: ``c > 1`` caps the loss of ``A < 0`` tokens at ``c * |A|``; None = off.
        agg: aggregation mode, see :func:`aggregate_loss`.
        weights: optional ``(B, T)``/``(B,)`` per-token multipliers, e.g. truncated IS or
            staleness weights; treated as constants (multiplied with ``w``).
        behav_logp: ``(B, T)`` log-probs of the behaviour policy (no grad); None = plain PPO.
        behav_weight_cap: truncation level for ``w`` (> 0), None = no truncation.
        behav_weight_mode: ``"truncate"`` or ``"mask"`` (see above).
        global_num_tokens, global_num_seqs, norm_length: see :func:`aggregate_loss`.
    Returns:
        :class:`PolicyLossResult` (``behav_weight_mean`` set with ``weights`` or
        ``behav_logp``).
    """
    who = "ppo_policy_loss"
    _check_clip(clip_low, clip_high, dual_clip, who)
    mask = _check_mask(logp, mask, who)
    old_logp = _per_token(old_logp, logp, "old_logp", who).detach()
    advantages = _per_token(advantages, logp, "advantages", who).detach()
    weights, mask = _token_weights(
        old_logp, weights, behav_logp, mask, behav_weight_cap, behav_weight_mode, who
    )
    log_ratio = logp - old_logp
    ratio = torch.exp(log_ratio)
    loss_mat, is_clipped, is_dual = _clipped_surrogate(
        ratio, advantages, clip_low, clip_high, dual_clip
    )
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
    """REINFORCE-style loss ``-w * A * log pi`` (use with V-trace's ``pg_advantages``).

    Args:
        logp: ``(B, T)`` with gradient; ``advantages``/``weights``: ``(B, T)`` or ``(B,)``,
            treated as constants; ``mask``: ``(B, T)``.
    Returns:
        0-dim loss.
    """
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
    """Per-token estimate of KL(pi_theta || pi_ref) from samples of pi_theta (Schulman, 2020).

    With ``log_r = ref_logp - logp``: ``k1 = -log_r`` (unbiased, can be negative),
    ``k2 = log_r**2 / 2`` (biased, low variance), ``k3 = (exp(log_r) - 1) - log_r``
    (unbiased, >= 0). Gradient flows through ``logp``; ``ref_logp`` is a constant.

    Args:
        logp, ref_logp: same shape, e.g. ``(B, T)``.
    Returns:
        Tensor of that shape; aggregate it with :func:`aggregate_loss`.
    """
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
    """GRPO's group-relative advantages (Shao et al., 2024) for ``rewards`` laid out group
    after group: ``A_i = (r_i - mean(r_group)) / (std(r_group) + eps)`` with the *unbiased*
    std (as in verl and TRL: the group ``[1, 0, 0, 1]`` gives ``+-0.866``); no value function.
    GAE is :func:`~nobubble.rl.algo.vtrace.vtrace` with ``log_rhos = 0``.

    Args:
        rewards: ``(N,)`` float, ``N = num_groups * group_size``; responses ``g*group_size ..
            (g+1)*group_size - 1`` answer the same prompt.
        group_size: responses per prompt, >= 1.
        scale: ``"group"`` divides by the group's unbiased std, ``"batch"`` by the unbiased
            std of the whole batch (REINFORCE++), ``"none"`` does not divide (Dr. GRPO).
        eps: added to the std before dividing, > 0.
    Returns:
        ``(N,)`` advantages, same dtype as ``rewards``, no gradient. Zero-variance groups and
        singleton groups give exactly 0.
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
