"""Off-policy corrections from the behaviour log-probs carried with each sample.

An asynchronous rollout worker samples with an older policy mu (its log-probs travel with
the sample as ``behav_logp``); the learner evaluates the current policy pi (``logp``). The
off-policy gradient is ``E_mu[rho * A * grad log pi]`` with ``rho = pi / mu``. Two ways to
keep its variance bounded (as in verl's rollout correction, Yao et al., 2025 "TIS"/"MIS"):

- *truncate*: ``w = min(rho, cap)`` (truncated importance sampling, IMPALA's rho-bar);
- *mask*: drop tokens (or whole sequences) whose ``rho`` falls outside ``[low, high]``.

``level`` says what ``rho`` is:

- ``"token"``: per token, ``rho_t = exp(logp_t - behav_logp_t)``;
- ``"sequence"``: one ratio per response, ``exp(sum_t (logp_t - behav_logp_t))``, the exact
  sequence likelihood ratio, broadcast to its tokens;
- ``"geometric"``: the per-token geometric mean ``exp(mean_t (...))``, which stays near 1 for
  long responses where the product explodes.

Weights are constants (detached): they scale the gradient, they are not differentiated.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

__all__ = [
    "ISLevel",
    "OffPolicyCorrection",
    "importance_log_ratio",
    "truncated_importance_weights",
    "mask_outside_band",
    "off_policy_correction",
]

ISLevel = Literal["token", "sequence", "geometric"]
_LEVELS = ("token", "sequence", "geometric")
_MAX_LOG_RATIO = 20.0  # exp(20) ~ 5e8: far above any cap, still finite in float32


@dataclass(frozen=True)
class OffPolicyCorrection:
    """What :func:`off_policy_correction` decided, per token.

    Attributes:
        weights: ``(B, T)`` truncated importance weights (1 where no truncation is asked),
            0 on tokens outside ``mask``; detached.
        mask: ``(B, T)`` float, the input mask minus the tokens dropped by the band.
        truncated_fraction: share of valid input tokens whose ratio exceeded the cap.
        masked_fraction: share of valid input tokens dropped by the band.
    """

    weights: torch.Tensor
    mask: torch.Tensor
    truncated_fraction: torch.Tensor
    masked_fraction: torch.Tensor


def importance_log_ratio(
    logp: torch.Tensor, behav_logp: torch.Tensor, mask: torch.Tensor, level: ISLevel = "token"
) -> torch.Tensor:
    """``log rho`` at the requested level, broadcast to ``(B, T)``, detached.

    Args:
        logp: ``(B, T)`` log pi (the policy being trained).
        behav_logp: ``(B, T)`` log mu (the policy that sampled).
        mask: ``(B, T)`` bool/float, 1 on response tokens.
        level: ``"token"``, ``"sequence"`` or ``"geometric"``.
    """
    if logp.dim() != 2 or behav_logp.shape != logp.shape or mask.shape != logp.shape:
        raise ValueError(
            f"importance_log_ratio: logp {tuple(logp.shape)}, behav_logp "
            f"{tuple(behav_logp.shape)} and mask {tuple(mask.shape)} must all be (B, T)"
        )
    if level not in _LEVELS:
        raise ValueError(f"importance_log_ratio: level={level!r}; use one of {_LEVELS}")
    mask = mask.to(logp.dtype)
    log_ratio = (logp.detach() - behav_logp.detach()) * mask  # (B, T)
    if level == "token":
        return log_ratio
    per_seq = log_ratio.sum(dim=1, keepdim=True)  # (B, 1)
    if level == "geometric":
        per_seq = per_seq / mask.sum(dim=1, keepdim=True).clamp(min=1.0)
    return per_seq.expand_as(log_ratio)  # (B, T)


def truncated_importance_weights(
    logp: torch.Tensor,
    behav_logp: torch.Tensor,
    mask: torch.Tensor,
    *,
    level: ISLevel = "token",
    cap: float = 2.0,
) -> torch.Tensor:
    """``min(rho, cap)`` per token, 0 outside ``mask``; ``(B, T)``, detached."""
    if cap <= 0:
        raise ValueError(f"truncated_importance_weights: cap={cap} must be > 0 (e.g. 2.0)")
    log_ratio = importance_log_ratio(logp, behav_logp, mask, level)
    rho = torch.exp(log_ratio.clamp(max=_MAX_LOG_RATIO))
    return rho.clamp(max=cap) * mask.to(logp.dtype)


def mask_outside_band(
    logp: torch.Tensor,
    behav_logp: torch.Tensor,
    mask: torch.Tensor,
    *,
    level: ISLevel = "token",
    low: float = 0.5,
    high: float = 2.0,
) -> torch.Tensor:
    """The input mask with tokens whose ``rho`` is outside ``[low, high]`` set to 0.

    At ``"sequence"``/``"geometric"`` level a whole response is kept or dropped.
    Returns ``(B, T)`` float.
    """
    if not 0.0 <= low < 1.0 < high:
        raise ValueError(
            f"mask_outside_band: band [low={low}, high={high}] must satisfy 0 <= low < 1 < high"
        )
    log_ratio = importance_log_ratio(logp, behav_logp, mask, level)
    rho = torch.exp(log_ratio.clamp(min=-_MAX_LOG_RATIO, max=_MAX_LOG_RATIO))
    inside = (rho >= low) & (rho <= high)
    return mask.to(logp.dtype) * inside.to(logp.dtype)


def off_policy_correction(
    logp: torch.Tensor,
    behav_logp: torch.Tensor,
    mask: torch.Tensor,
    *,
    level: ISLevel = "token",
    cap: float | None = 2.0,
    band: tuple[float, float] | None = None,
) -> OffPolicyCorrection:
    """Truncate (``cap``) and/or mask (``band``) in one call; either may be None.

    Use the result as ``ppo_policy_loss(..., mask=c.mask, weights=c.weights)``.
    """
    mask = mask.to(logp.dtype)
    num_valid = mask.sum().clamp(min=1.0)
    new_mask = mask
    if band is not None:
        new_mask = mask_outside_band(logp, behav_logp, mask, level=level, low=band[0], high=band[1])
    if cap is None:
        weights = new_mask.clone()
        truncated = torch.zeros((), dtype=logp.dtype, device=logp.device)
    else:
        weights = truncated_importance_weights(logp, behav_logp, new_mask, level=level, cap=cap)
        rho = torch.exp(
            importance_log_ratio(logp, behav_logp, new_mask, level).clamp(max=_MAX_LOG_RATIO)
        )
        truncated = ((rho > cap).to(logp.dtype) * new_mask).sum() / num_valid
    return OffPolicyCorrection(
        weights=weights,
        mask=new_mask,
        truncated_fraction=truncated,
        masked_fraction=(mask - new_mask).sum() / num_valid,
    )
