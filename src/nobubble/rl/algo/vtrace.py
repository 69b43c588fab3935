"""V-trace off-policy targets (Espeholt et al., 2018, IMPALA), with rlax's lambda.

All tensors are time-major ``[T, B]`` (extra trailing dims allowed). With
``rho_t = pi(a_t|x_t) / mu(a_t|x_t)``:

    vs_t = V(x_t) + sum_{s>=t} (prod_{i=t}^{s-1} gamma_i c_i) * delta_s
    delta_s = min(rho_bar, rho_s) * (r_s + gamma_s V(x_{s+1}) - V(x_s))
    c_i = lambda * min(1, rho_i)

computed by the backward recursion ``vs_t - V(x_t) = delta_t + gamma_t c_t (vs_{t+1} -
V(x_{t+1}))``. The policy-gradient advantage is

    A_t = min(rho_bar_pg, rho_t) * (r_t + gamma_t (lambda vs_{t+1} + (1 - lambda) V(x_{t+1}))
          - V(x_t))

with ``vs_T = V(x_T) = bootstrap_value`` (rlax ``vtrace_td_error_and_advantage``). Both
outputs are targets: they carry no gradient, as in DeepMind's scalable_agent.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

__all__ = ["VTraceReturns", "vtrace", "vtrace_from_logits"]


@dataclass(frozen=True)
class VTraceReturns:
    """V-trace targets.

    Attributes:
        vs: ``[T, B, ...]`` value targets, no gradient.
        pg_advantages: ``[T, B, ...]`` policy-gradient advantages, no gradient.
        log_rhos: ``[T, B, ...]`` log pi(a|x) - log mu(a|x) they were computed from, no gradient.
        target_action_log_probs: ``[T, B]`` log pi(a_t|x_t) *with* gradient (for the loss);
            set by :func:`vtrace_from_logits` only.
    """

    vs: torch.Tensor
    pg_advantages: torch.Tensor
    log_rhos: torch.Tensor
    target_action_log_probs: torch.Tensor | None = None


def vtrace(
    log_rhos: torch.Tensor,
    discounts: torch.Tensor | float,
    rewards: torch.Tensor,
    values: torch.Tensor,
    bootstrap_value: torch.Tensor,
    clip_rho_threshold: float | None = 1.0,
    clip_pg_rho_threshold: float | None = 1.0,
    lambda_: float = 1.0,
) -> VTraceReturns:
    """V-trace value targets and policy-gradient advantages.

    Args:
        log_rhos: ``[T, B, ...]`` float, log pi(a_t|x_t) - log mu(a_t|x_t).
        discounts: ``[T, B, ...]`` float, gamma_t (0 where the episode ended at t), or one
            float for all steps.
        rewards: ``[T, B, ...]`` float.
        values: ``[T, B, ...]`` float, V(x_t) under the learner's value function.
        bootstrap_value: ``[B, ...]`` float, V(x_T).
        clip_rho_threshold: rho_bar for the value target (None = no clipping).
        clip_pg_rho_threshold: rho_bar for the policy-gradient advantage (None = no clip).
        lambda_: trace-cutting lambda in [0, 1] (rlax); 1 is the paper's V-trace.
    Returns:
        :class:`VTraceReturns`, detached.
    """
    if not 0.0 <= lambda_ <= 1.0:
        raise ValueError(f"vtrace: lambda_={lambda_} must be in [0, 1]")
    for name, thr in (
        ("clip_rho_threshold", clip_rho_threshold),
        ("clip_pg_rho_threshold", clip_pg_rho_threshold),
    ):
        if thr is not None and thr <= 0:
            raise ValueError(f"vtrace: {name}={thr} must be > 0 or None")
    if not isinstance(discounts, torch.Tensor):  # one gamma for every step
        discounts = torch.full_like(values, float(discounts))
    if values.dim() < 1 or bootstrap_value.shape != values.shape[1:]:
        raise ValueError(
            f"vtrace: values {tuple(values.shape)} must be [T, B, ...] and bootstrap_value "
            f"{tuple(bootstrap_value.shape)} must be values.shape[1:] = {tuple(values.shape[1:])}"
        )
    for name, x in (("log_rhos", log_rhos), ("discounts", discounts), ("rewards", rewards)):
        if x.shape != values.shape:
            raise ValueError(
                f"vtrace: {name} has shape {tuple(x.shape)} but values has "
                f"{tuple(values.shape)}; all time-major inputs must be [T, B, ...] alike"
            )
    with torch.no_grad():
        log_rhos, discounts, rewards = log_rhos.detach(), discounts.detach(), rewards.detach()
        values, bootstrap_value = values.detach(), bootstrap_value.detach()
        rhos = torch.exp(log_rhos)
        clipped_rhos = rhos if clip_rho_threshold is None else rhos.clamp(max=clip_rho_threshold)
        cs = lambda_ * rhos.clamp(max=1.0)
        values_tp1 = torch.cat([values[1:], bootstrap_value.unsqueeze(0)])  # [T, B, ...]
        deltas = clipped_rhos * (rewards + discounts * values_tp1 - values)

        vs_minus_v = torch.empty_like(values)
        acc = torch.zeros_like(bootstrap_value)
        for t in reversed(range(values.shape[0])):
            acc = deltas[t] + discounts[t] * cs[t] * acc
            vs_minus_v[t] = acc
        vs = vs_minus_v + values

        vs_tp1 = torch.cat([vs[1:], bootstrap_value.unsqueeze(0)])  # [T, B, ...]
        q_bootstrap = lambda_ * vs_tp1 + (1.0 - lambda_) * values_tp1
        pg_rhos = rhos if clip_pg_rho_threshold is None else rhos.clamp(max=clip_pg_rho_threshold)
        pg_advantages = pg_rhos * (rewards + discounts * q_bootstrap - values)
        return VTraceReturns(vs=vs, pg_advantages=pg_advantages, log_rhos=log_rhos)


def vtrace_from_logits(
    behaviour_policy_logits: torch.Tensor,
    target_policy_logits: torch.Tensor,
    actions: torch.Tensor,
    discounts: torch.Tensor,
    rewards: torch.Tensor,
    values: torch.Tensor,
    bootstrap_value: torch.Tensor,
    clip_rho_threshold: float | None = 1.0,
    clip_pg_rho_threshold: float | None = 1.0,
    lambda_: float = 1.0,
) -> VTraceReturns:
    """V-trace for softmax policies given as logits (the environment producer's loss).

    Args:
        behaviour_policy_logits: ``[T, B, A]`` float, logits of the actor (mu).
        target_policy_logits: ``[T, B, A]`` float, logits of the learner (pi), with gradient.
        actions: ``[T, B]`` int64 in ``[0, A)``.
        discounts, rewards, values: ``[T, B]`` float; bootstrap_value: ``[B]``.
        clip_rho_threshold, clip_pg_rho_threshold, lambda_: as in :func:`vtrace`.
    Returns:
        :class:`VTraceReturns` with ``target_action_log_probs`` set.
    """
    if behaviour_policy_logits.shape != target_policy_logits.shape:
        raise ValueError(
            f"vtrace_from_logits: behaviour logits {tuple(behaviour_policy_logits.shape)} and "
            f"target logits {tuple(target_policy_logits.shape)} must both be [T, B, A]"
        )
    if actions.shape != target_policy_logits.shape[:-1] or actions.dtype != torch.int64:
        raise ValueError(
            f"vtrace_from_logits: actions {tuple(actions.shape)} {actions.dtype} must be int64 "
            f"with shape {tuple(target_policy_logits.shape[:-1])}"
        )
    index = actions.unsqueeze(-1)  # [T, B, 1]
    behaviour_lp = F.log_softmax(behaviour_policy_logits.detach(), -1).gather(-1, index)
    target_lp = F.log_softmax(target_policy_logits, -1).gather(-1, index).squeeze(-1)  # [T, B]
    out = vtrace(
        (target_lp - behaviour_lp.squeeze(-1)).detach(),
        discounts,
        rewards,
        values,
        bootstrap_value,
        clip_rho_threshold=clip_rho_threshold,
        clip_pg_rho_threshold=clip_pg_rho_threshold,
        lambda_=lambda_,
    )
    return VTraceReturns(out.vs, out.pg_advantages, out.log_rhos, target_lp)
