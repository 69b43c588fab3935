"""Slow, obviously-correct RL formulas that the tests check the toolbox against.

Each function is its paper's formula written one element at a time: Python loops over
sequences, tokens and time steps, Python floats for everything the formula treats as a
constant (advantages, old / proximal / behaviour log-probs, weights, targets). It shares no
code with :mod:`~nobubble.rl.algo.losses`, :mod:`~nobubble.rl.algo.vtrace` or
:mod:`~nobubble.rl.algo.staleness` and imports
nothing from ``nobubble``, so a bug there cannot hide here. The losses are sums of scalar
tensors picked out of ``logp``, so ``torch.autograd`` gives their exact gradient with
respect to the log-probs.

Shapes: ``B`` sequences by ``T`` tokens; per-token inputs are ``(B, T)``; ``mask`` is
``(B, T)``, nonzero on the tokens that count; advantages and weights may also be ``(B,)``
(one per sequence). V-trace is time-major, ``[T, B]``, as in the IMPALA paper.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

__all__ = [
    "aggregate_ref",
    "grpo_advantages_ref",
    "ppo_clip_loss_ref",
    "decoupled_ppo_loss_ref",
    "policy_gradient_loss_ref",
    "kl_ref",
    "vtrace_ref",
    "staleness_weight_ref",
]

Rows = list[list[torch.Tensor]]  # one list of per-token losses per sequence (valid tokens)


def _at(x: torch.Tensor | None, b: int, t: int, default: float = 1.0) -> float:
    """Element ``(b, t)`` of a ``(B, T)`` tensor or ``b`` of a ``(B,)`` one, as a constant."""
    if x is None:
        return default
    return float(x[b].detach()) if x.dim() == 1 else float(x[b, t].detach())


def _tokens(logp: torch.Tensor, mask: torch.Tensor) -> list[list[tuple[int, torch.Tensor]]]:
    """Per sequence, ``(t, logp[b, t])`` for each valid token (scalars that keep the graph)."""
    assert logp.dim() == 2 and mask.shape == logp.shape, "logp and mask must be (B, T)"
    return [
        [(t, x) for t, x in enumerate(row.unbind(0)) if float(mask[b, t]) != 0.0]
        for b, row in enumerate(logp.unbind(0))
    ]


def aggregate_ref(
    rows: Rows | torch.Tensor,
    mask: torch.Tensor | None = None,
    agg: str = "token-mean",
    norm_length: float | None = None,
    *,
    zero: torch.Tensor | None = None,
) -> torch.Tensor:
    """One number from per-token losses ``l_bt`` over the valid tokens (verl's ``agg_loss``).

    With ``n_b`` valid tokens in sequence ``b`` and ``S`` sequences that have any:

    - ``token-mean``: ``sum_b sum_t l_bt / sum_b n_b``;
    - ``seq-mean-token-mean``: ``(1/S) sum_b (1/n_b) sum_t l_bt``;
    - ``seq-mean-token-sum``: ``(1/S) sum_b sum_t l_bt``;
    - ``seq-mean-token-sum-norm``: ``(1/S) sum_b (1/L) sum_t l_bt``, ``L = norm_length``.

    ``rows`` is a list (per sequence) of the valid tokens' losses, or a ``(B, T)`` tensor
    with its ``mask``. No valid token gives 0 (``zero``, to keep a graph).
    """
    if isinstance(rows, torch.Tensor):
        assert mask is not None, "a (B, T) loss needs its mask"
        if norm_length is None:
            norm_length = rows.shape[1]
        if zero is None:
            zero = rows.sum() * 0.0
        rows = [[x for _, x in seq] for seq in _tokens(rows, mask)]
    nonempty = [r for r in rows if r]
    total = torch.zeros((), dtype=torch.float64) if zero is None else zero
    if not nonempty:
        return total
    if agg == "token-mean":
        for row in nonempty:
            for x in row:
                total = total + x
        return total / sum(len(r) for r in nonempty)
    for row in nonempty:
        seq_sum = row[0]
        for x in row[1:]:
            seq_sum = seq_sum + x
        if agg == "seq-mean-token-mean":
            seq_sum = seq_sum / len(row)
        elif agg == "seq-mean-token-sum-norm":
            assert norm_length is not None, "seq-mean-token-sum-norm needs norm_length"
            seq_sum = seq_sum / norm_length
        else:
            assert agg == "seq-mean-token-sum", f"unknown agg {agg!r}"
        total = total + seq_sum
    return total / len(nonempty)


def grpo_advantages_ref(
    rewards: Sequence[float] | torch.Tensor,
    group_size: int,
    scale: str = "group",
    eps: float = 1e-6,
) -> torch.Tensor:
    """GRPO's group-relative advantage (Shao et al., 2024), ``(N,)`` float64.

    For response ``i`` of a group ``G`` of ``k`` responses (adjacent in ``rewards``):

        A_i = (r_i - mean_G) / (std_G + eps),  std_G = sqrt(sum_j (r_j - mean_G)^2 / (k - 1))

    (the unbiased std). ``scale="batch"`` divides by the unbiased std of all ``N`` rewards
    instead (no division when ``N == 1``), ``scale="none"`` not at all. A group of one, or
    whose rewards are all equal, gets exactly 0.
    """
    r = [float(x) for x in rewards]
    k = group_size
    assert k >= 1 and len(r) % k == 0, "group_size must divide the number of rewards"
    batch_std = None
    if scale == "batch" and len(r) > 1:
        batch_mean = sum(r) / len(r)
        batch_std = math.sqrt(sum((x - batch_mean) ** 2 for x in r) / (len(r) - 1))
    out = []
    for start in range(0, len(r), k):
        group = r[start : start + k]
        if k == 1 or max(group) == min(group):
            out += [0.0] * k
            continue
        mean = sum(group) / k
        std = math.sqrt(sum((x - mean) ** 2 for x in group) / (k - 1))
        for x in group:
            if scale == "group":
                out.append((x - mean) / (std + eps))
            elif scale == "batch" and batch_std is not None:
                out.append((x - mean) / (batch_std + eps))
            else:
                assert scale in ("batch", "none"), f"unknown scale {scale!r}"
                out.append(x - mean)
    return torch.tensor(out, dtype=torch.float64)


def _value(x: torch.Tensor | float) -> float:
    return float(x.detach()) if isinstance(x, torch.Tensor) else float(x)


def _ppo_token(
    ratio: torch.Tensor, adv: float, clip_low: float, clip_high: float, dual_clip: float | None
) -> torch.Tensor:
    """``-min(r A, clip(r, 1 - clip_low, 1 + clip_high) A)``, then the dual clip's cap."""
    r = float(ratio.detach())
    if r < 1.0 - clip_low:
        clipped_ratio: torch.Tensor | float = 1.0 - clip_low  # a constant: no gradient
    elif r > 1.0 + clip_high:
        clipped_ratio = 1.0 + clip_high
    else:
        clipped_ratio = ratio
    unclipped, clipped = ratio * adv, clipped_ratio * adv
    objective = unclipped if _value(unclipped) <= _value(clipped) else clipped  # pessimistic
    loss = -torch.as_tensor(objective, dtype=ratio.dtype)
    if dual_clip is not None and adv < 0 and _value(loss) > dual_clip * -adv:
        return torch.as_tensor(dual_clip * -adv, dtype=ratio.dtype)  # a constant cap
    return loss


def _aggregate(rows: Rows, logp: torch.Tensor, agg: str, norm_length: float | None) -> torch.Tensor:
    """:func:`aggregate_ref` of per-token losses of ``logp [B, N]`` (``norm_length`` default
    ``N``); a zero attached to ``logp``'s graph when no token counts."""
    length = logp.shape[1] if norm_length is None else norm_length
    return aggregate_ref(rows, agg=agg, norm_length=length, zero=logp.sum() * 0.0)


def ppo_clip_loss_ref(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    dual_clip: float | None = None,
    agg: str = "token-mean",
    *,
    weights: torch.Tensor | None = None,
    norm_length: float | None = None,
) -> torch.Tensor:
    """PPO's clipped surrogate (Schulman et al., 2017, eq. 7) as a loss, per valid token:

        l_t = -w_t min(r_t A_t, clip(r_t, 1 - clip_low, 1 + clip_high) A_t),
        r_t = exp(logp_t - old_logp_t)

    and with a dual clip ``c`` (Ye et al., 2020) ``l_t = min(l_t, c |A_t|)`` where
    ``A_t < 0``; then aggregated by :func:`aggregate_ref`. ``w`` (default 1), ``A`` and
    ``old_logp`` are constants.
    """
    rows: Rows = []
    for b, seq in enumerate(_tokens(logp, mask)):
        row = []
        for t, lp in seq:
            ratio = torch.exp(lp - float(old_logp[b, t]))
            loss = _ppo_token(ratio, _at(advantages, b, t), clip_low, clip_high, dual_clip)
            row.append(_at(weights, b, t) * loss)
        rows.append(row)
    return _aggregate(rows, logp, agg, norm_length)


def decoupled_ppo_loss_ref(
    logp: torch.Tensor,
    prox_logp: torch.Tensor,
    behav_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    dual_clip: float | None = None,
    agg: str = "token-mean",
    *,
    behav_weight_cap: float | None = 5.0,
    behav_weight_mode: str = "truncate",
    norm_length: float | None = None,
) -> torch.Tensor:
    """Decoupled PPO (Hilton et al., 2022; AReaL), per valid token:

        l_t = -w_t min(r_t A_t, clip(r_t, 1 - clip_low, 1 + clip_high) A_t),
        r_t = pi_theta / pi_prox = exp(logp_t - prox_logp_t)          (the trust region)
        w_t = min(pi_prox / pi_behav, cap) = min(exp(prox_t - behav_t), cap)  (constant)

    With ``behav_weight_mode="mask"`` a token whose ``pi_prox / pi_behav`` exceeds the cap is
    left out altogether (it counts in no denominator) instead of being truncated.
    """
    assert behav_weight_mode in ("truncate", "mask"), f"unknown mode {behav_weight_mode!r}"
    weights = torch.zeros(logp.shape, dtype=torch.float64)
    kept = mask.detach().clone()
    for b, seq in enumerate(_tokens(logp, mask)):
        for t, _ in seq:
            w = math.exp(float(prox_logp[b, t]) - float(behav_logp[b, t]))
            if behav_weight_cap is not None and w > behav_weight_cap:
                if behav_weight_mode == "mask":
                    kept[b, t] = 0  # counts in no denominator
                w = behav_weight_cap
            weights[b, t] = w
    # PPO's clip with the trust region at prox (r = pi / pi_prox), each token weighted by w
    return ppo_clip_loss_ref(logp, prox_logp, advantages, kept, clip_low, clip_high, dual_clip,
                             agg, weights=weights, norm_length=norm_length)  # fmt: skip


def policy_gradient_loss_ref(
    logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    agg: str = "token-mean",
    *,
    weights: torch.Tensor | None = None,
    norm_length: float | None = None,
) -> torch.Tensor:
    """REINFORCE with constant advantages (e.g. V-trace's): ``l_t = -w_t A_t logp_t``."""
    rows: Rows = [
        [-_at(weights, b, t) * _at(advantages, b, t) * lp for t, lp in seq]
        for b, seq in enumerate(_tokens(logp, mask))
    ]
    return _aggregate(rows, logp, agg, norm_length)


def kl_ref(logp: torch.Tensor, ref_logp: torch.Tensor, kind: str = "k3") -> torch.Tensor:
    """Schulman's (2020) estimators of KL(pi || pi_ref) from one sample ``x ~ pi``, per element.

    With ``q = pi_ref(x) / pi(x)`` (``ref_logp`` a constant):

        k1 = -log q,    k2 = (log q)^2 / 2,    k3 = q - 1 - log q

    Returns a tensor shaped like ``logp``, each element built from ``logp``'s own element.
    """
    flat = []
    for lp, ref in zip(logp.reshape(-1).unbind(0), ref_logp.reshape(-1).tolist()):
        log_q = ref - lp
        if kind == "k1":
            flat.append(-log_q)
        elif kind == "k2":
            flat.append(log_q * log_q / 2.0)
        else:
            assert kind == "k3", f"unknown KL estimator {kind!r}"
            flat.append(torch.exp(log_q) - 1.0 - log_q)
    if not flat:
        return logp * 0.0
    return torch.stack(flat).reshape(logp.shape)


def _clip(x: float, bar: float | None) -> float:
    return x if bar is None else min(bar, x)


def vtrace_ref(
    log_rhos: torch.Tensor,
    discounts: torch.Tensor,
    rewards: torch.Tensor,
    values: torch.Tensor,
    bootstrap_value: torch.Tensor,
    rho_bar: float | None = 1.0,
    c_bar: float = 1.0,
    pg_rho_bar: float | None = 1.0,
    lambda_: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """V-trace targets and policy-gradient advantages, IMPALA (Espeholt et al., 2018) eq. 1
    written as the explicit sum, each trajectory ``b`` on its own. With ``V_T`` the bootstrap:

        v_t   = V_t + sum_{s=t}^{T-1} (prod_{i=t}^{s-1} gamma_i c_i) delta_s
        delta_s = rho_s (r_s + gamma_s V_{s+1} - V_s),  rho_s = min(rho_bar, pi/mu at s)
        c_i   = lambda min(c_bar, pi/mu at i)
        A_t   = min(pg_rho_bar, pi/mu at t) (r_t + gamma_t (lambda v_{t+1}
                + (1 - lambda) V_{t+1}) - V_t),  v_T = V_T

    (lambda is rlax's trace cutting; 1 is the paper's V-trace). ``None`` for a bar: no clip.
    Inputs are ``[T, B]`` (bootstrap ``[B]``); returns ``(vs, pg_advantages)``, ``[T, B]``
    float64 targets (constants, like the package's).
    """
    num_steps, batch = values.shape
    vs = torch.zeros(num_steps, batch, dtype=torch.float64)
    pg = torch.zeros(num_steps, batch, dtype=torch.float64)
    for b in range(batch):
        ratio = [math.exp(float(x)) for x in log_rhos[:, b]]
        gamma = [float(x) for x in discounts[:, b]]
        r = [float(x) for x in rewards[:, b]]
        v = [float(x) for x in values[:, b]] + [float(bootstrap_value[b])]  # V_0 .. V_T
        delta = [
            _clip(ratio[s], rho_bar) * (r[s] + gamma[s] * v[s + 1] - v[s]) for s in range(num_steps)
        ]
        c = [lambda_ * min(c_bar, ratio[i]) for i in range(num_steps)]
        v_trace = []
        for t in range(num_steps):
            total = v[t]
            for s in range(t, num_steps):
                trace = 1.0
                for i in range(t, s):
                    trace *= gamma[i] * c[i]
                total += trace * delta[s]
            v_trace.append(total)
        v_trace.append(v[num_steps])  # v_T = V_T
        for t in range(num_steps):
            q = r[t] + gamma[t] * (lambda_ * v_trace[t + 1] + (1.0 - lambda_) * v[t + 1])
            pg[t, b] = _clip(ratio[t], pg_rho_bar) * (q - v[t])
            vs[t, b] = v_trace[t]
    return vs, pg


def staleness_weight_ref(lag: float, kind: str = "inverse", half_life: float = 1.0) -> float:
    """Weight of a sample ``lag`` policy versions old: ``inverse`` ``1 / (1 + lag)``,
    ``exp`` ``2^(-lag / half_life)`` (halves every ``half_life`` versions), ``none`` 1."""
    assert lag >= 0 and half_life > 0, "lag must be >= 0 and half_life > 0"
    if kind == "inverse":
        return 1.0 / (1.0 + lag)
    if kind == "exp":
        return 2.0 ** (-lag / half_life)
    assert kind == "none", f"unknown staleness weighting {kind!r}"
    return 1.0
