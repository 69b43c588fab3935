"""V-trace targets (Espeholt et al., 2018, IMPALA) with rlax's lambda, time-major ``[T, B, ...]``.
With ``rho_t = pi(a_t|x_t) / mu(a_t|x_t)``, ``c_t = lambda min(1, rho_t)``, ``vs_T = V(x_T)``:

    vs_t - V(x_t) = min(rho_bar, rho_t) (r_t + gamma_t V(x_{t+1}) - V(x_t))
                    + gamma_t c_t (vs_{t+1} - V(x_{t+1}))
    A_t = min(rho_bar_pg, rho_t) (r_t + gamma_t (lambda vs_{t+1} + (1 - lambda) V(x_{t+1}))
          - V(x_t))

(rlax ``vtrace_td_error_and_advantage``), both without gradient (scalable_agent)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

__all__ = ["VTraceReturns", "vtrace", "vtrace_from_logits"]


@dataclass(frozen=True)
class VTraceReturns:
    """V-trace's ``[T, B, ...]`` targets ``vs`` and ``pg_advantages`` and the ``log_rhos``
    they came from (no gradient); :func:`vtrace_from_logits` also sets
    ``target_action_log_probs`` ``[T, B]``, log pi(a_t|x_t), and ``target_log_probs``
    ``[T, B, A]``, log pi(.|x_t), both *with* gradient (the loss, the entropy)."""

    vs: torch.Tensor
    pg_advantages: torch.Tensor
    log_rhos: torch.Tensor
    target_action_log_probs: torch.Tensor | None = None
    target_log_probs: torch.Tensor | None = None


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
    """V-trace value targets and policy-gradient advantages (detached), from ``[T, B, ...]``
    float ``log_rhos`` (log pi - log mu), ``discounts`` (gamma_t, 0 where the episode ended at
    t; or one float), ``rewards`` and ``values`` (V(x_t)), and ``bootstrap_value`` ``[B, ...]``
    (V(x_T)). ``clip_rho_threshold`` / ``clip_pg_rho_threshold``: rho_bar / rho_bar_pg (> 0;
    None = no clip); ``lambda_`` in [0, 1] (1 is the paper's V-trace)."""
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
        log_rhos = log_rhos.detach()  # returned; what no_grad computes has no gradient anyway
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
    discounts: torch.Tensor | float,
    rewards: torch.Tensor,
    values: torch.Tensor,
    bootstrap_value: torch.Tensor,
    **options: Any,
) -> VTraceReturns:
    """:func:`vtrace` for softmax policies given as ``[T, B, A]`` logits of the actor (mu) and
    the learner (pi, with gradient), ``actions`` ``[T, B]`` int64 in ``[0, A)``, the rest
    ``[T, B]`` (``bootstrap_value`` ``[B]``) and ``options`` (``clip_rho_threshold``,
    ``clip_pg_rho_threshold``, ``lambda_``) as there; sets ``target_action_log_probs`` and ``target_log_probs``."""
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
    target_all = F.log_softmax(target_policy_logits, -1)  # [T, B, A]
    target_lp = target_all.gather(-1, index).squeeze(-1)  # [T, B]
    log_rhos = target_lp - behaviour_lp.squeeze(-1)  # [T, B]; vtrace detaches it
    out = vtrace(log_rhos, discounts, rewards, values, bootstrap_value, **options)
    return VTraceReturns(out.vs, out.pg_advantages, out.log_rhos, target_lp, target_all)
