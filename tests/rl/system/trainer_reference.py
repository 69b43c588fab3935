"""What one learner step on :class:`~nobubble.rl.system.learner.GroupLoss` should compute,
written with the reference formulas of `tests/rl/algo/reference.py` (shared by the trainer
and the learner tests; no ``Learner`` or ``GroupLoss`` code runs here).

From the policy's own log-probs ``logp`` (B, N) of the response tokens, the objective is

    algo loss (on per-token weights w = staleness weight of the token's own lag)
    + kl_coef * mean KL_k3(pi || pi_ref) - entropy_coef * mean H(pi)
    + uniform_kl_coef * mean KL(uniform || pi)

every mean over the response tokens. The algorithms, as :mod:`~nobubble.rl.system.learner`
documents them: ``grpo`` is PPO's clip around the behaviour policy with group advantages;
``decoupled-ppo`` centres the clip on this step's weights and weights each token by the
truncated ``pi_prox / pi_behav``; ``ppo`` uses ``R - V(s_t)`` plus a value loss; ``vtrace``
takes V-trace's advantages (reward at the last response token, nothing after it, rho-bar
and c-bar 1) into REINFORCE, ``vtrace-ppo`` into PPO's clip, both plus a value loss to the
V-trace targets.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from nobubble.rl.system.config import RunConfig
from nobubble.rl.system.policies import response_logits
from nobubble.rl.system.tasks import TaskSpec
from nobubble.rl.system.types import Sample, SampleGroup
from tests.rl.algo.reference import (
    aggregate_ref,
    decoupled_ppo_loss_ref,
    grpo_advantages_ref,
    kl_ref,
    policy_gradient_loss_ref,
    ppo_clip_loss_ref,
    staleness_weight_ref,
    vtrace_ref,
)

__all__ = ["policy_logprobs", "reference_loss", "reference_train_step"]


def policy_logprobs(
    model: nn.Module, tokens: torch.Tensor, task: TaskSpec
) -> tuple[torch.Tensor, torch.Tensor]:
    """``log pi(v | s_t)`` for every vocabulary entry ``(B, N, V)`` and ``V(s_t)`` ``(B, N)``,
    float64, at the positions that predict the response tokens ``tokens[:, P:]``."""
    p, pad = task.prompt_len, task.tokenizer.pad_id
    num_seqs, length = tokens.shape
    inputs = tokens[:, :-1]  # (B, P + N - 1): position t predicts token t + 1
    lead = []  # left padding of each prompt: its leading pad tokens
    for b in range(num_seqs):
        row = tokens[b, :p].tolist()
        lead.append(next((i for i, t in enumerate(row) if t != pad), p))
    if any(lead):  # the pads are masked out and do not count as positions
        mask = torch.ones(num_seqs, length - 1, dtype=torch.long)
        positions = torch.zeros(num_seqs, length - 1, dtype=torch.long)
        for b, n in enumerate(lead):
            mask[b, :n] = 0
            positions[b, n:] = torch.arange(length - 1 - n)
        logits, values = model(inputs, mask, positions)
    else:
        logits, values = model(inputs)
    logits, values = logits[:, p - 1 :], values[:, p - 1 :]  # (B, N, V), (B, N)
    return torch.log_softmax(logits.double(), dim=-1), values.double()


def _token_weights(
    samples: list[Sample], version: int, cfg: RunConfig, mask: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per token: the staleness weight of its own lag, and the mask without the tokens
    older than ``token_drop_staleness``; both (B, N) float64."""
    w, keep = torch.ones_like(mask), mask.clone()
    for b, s in enumerate(samples):
        n = mask.shape[1]
        made_by = [s.policy_version] * n if s.token_versions is None else s.token_versions.tolist()
        for t in range(n):
            lag = version - made_by[t]
            w[b, t] = staleness_weight_ref(lag, cfg.trainer.staleness_weighting)
            if cfg.token_drop_staleness is not None and lag > cfg.token_drop_staleness:
                keep[b, t] = 0.0
    return w, keep


def _vtrace_per_sequence(
    logp: torch.Tensor,
    behav: torch.Tensor,
    values: torch.Tensor,
    rewards: list[float],
    mask: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """V-trace targets and advantages (B, N), each response its own episode: its tokens are
    the steps, discount 1, the reward at the last token, value 0 after it."""
    vs, pg = torch.zeros_like(mask), torch.zeros_like(mask)
    for b, reward in enumerate(rewards):
        n = int(mask[b].sum())
        assert mask[b, :n].all() and not mask[b, n:].any(), "response masks are prefixes"
        if n == 0:
            continue
        step_rewards = torch.zeros(n, 1, dtype=torch.float64)
        step_rewards[-1, 0] = reward
        vs_b, pg_b = vtrace_ref(
            (logp[b, :n] - behav[b, :n]).detach()[:, None],  # [n, 1] log pi/mu
            torch.ones(n, 1, dtype=torch.float64),
            step_rewards,
            values[b, :n].detach()[:, None],
            torch.zeros(1, dtype=torch.float64),
        )
        vs[b, :n], pg[b, :n] = vs_b[:, 0], pg_b[:, 0]
    return vs, pg


def _algo_loss(
    cfg: RunConfig,
    logp: torch.Tensor,
    values: torch.Tensor,
    behav: torch.Tensor,
    rewards: list[float],
    mask: torch.Tensor,
    w: torch.Tensor,
    group_size: int,
) -> torch.Tensor:
    """The algorithm's loss (``cfg.algo``), its value loss included."""
    eps = cfg.trainer.clip
    if cfg.algo in ("grpo", "decoupled-ppo"):
        adv = grpo_advantages_ref(rewards, group_size)[:, None] * w  # (B, N)
        if cfg.algo == "grpo":
            return ppo_clip_loss_ref(logp, behav, adv, mask, eps, eps)
        prox = logp.detach()  # the weights before this step
        return decoupled_ppo_loss_ref(logp, prox, behav, adv, mask, eps, eps)
    vals = values * mask  # (B, N); 0 after the response
    if cfg.algo == "ppo":
        returns = torch.tensor(rewards, dtype=torch.float64)[:, None]  # (B, 1)
        adv = (returns - vals.detach()) * w
        value_loss = aggregate_ref((vals - returns) ** 2, mask)
        return (
            ppo_clip_loss_ref(logp, behav, adv, mask, eps, eps)
            + cfg.trainer.value_coef * value_loss
        )
    vs, pg_adv = _vtrace_per_sequence(logp, behav, vals, rewards, mask)
    pg_adv = pg_adv * w
    value_loss = aggregate_ref((vals - vs) ** 2, mask)
    if cfg.algo == "vtrace-ppo":
        policy_loss = ppo_clip_loss_ref(logp, behav, pg_adv, mask, eps, eps)
    else:
        assert cfg.algo == "vtrace", f"no reference for algo {cfg.algo!r}"
        policy_loss = policy_gradient_loss_ref(logp, pg_adv, mask)
    return policy_loss + cfg.trainer.value_coef * value_loss


def reference_loss(
    model: nn.Module,
    groups: list[SampleGroup],
    cfg: RunConfig,
    task: TaskSpec,
    version: int,
    *,
    kl_model: nn.Module | None = None,
) -> torch.Tensor:
    """The trainer's objective on ``groups`` for a trainer at ``version`` (module docstring);
    ``kl_model`` is the KL term's reference policy (needed when ``cfg.trainer.kl_coef > 0``)."""
    samples = [s for g in groups for s in g.samples]
    tokens = torch.stack([s.tokens for s in samples])  # (B, P + N)
    mask = torch.stack([s.response_mask for s in samples]).double()  # (B, N)
    behav = torch.stack([s.behaviour_logprobs for s in samples]).double()  # (B, N)
    rewards = [float(s.reward) for s in samples]  # type: ignore[arg-type]
    w, mask = _token_weights(samples, version, cfg, mask)
    logp_all, values = policy_logprobs(model, tokens, task)  # (B, N, V), (B, N)
    actions = tokens[:, task.prompt_len :]  # (B, N)
    logp = logp_all.gather(2, actions[..., None]).squeeze(2)  # (B, N)
    loss = _algo_loss(cfg, logp, values, behav, rewards, mask, w, len(groups[0].samples))
    if cfg.trainer.kl_coef > 0:
        assert kl_model is not None, "kl_coef > 0 needs the reference policy"
        with torch.no_grad():
            ref_all, _ = policy_logprobs(kl_model, tokens, task)
        ref_logp = ref_all.gather(2, actions[..., None]).squeeze(2)  # (B, N)
        loss = loss + cfg.trainer.kl_coef * aggregate_ref(kl_ref(logp, ref_logp, "k3"), mask)
    entropy = -(logp_all.exp() * logp_all).sum(-1)  # (B, N)
    uniform_kl = (-math.log(logp_all.shape[-1]) - logp_all).mean(-1)  # KL(U || pi), (B, N)
    return (
        loss
        - cfg.trainer.entropy_coef * aggregate_ref(entropy, mask)
        + cfg.trainer.uniform_kl_coef * aggregate_ref(uniform_kl, mask)
    )


def reference_train_step(
    model: nn.Module,
    opt: torch.optim.Optimizer,
    groups: list[SampleGroup],
    cfg: RunConfig,
    task: TaskSpec,
    version: int,
) -> float:
    """One plain step: the reference loss, its gradient clipped to ``max_grad_norm``, the
    optimizer's step. Returns the loss."""
    model.train()
    opt.zero_grad(set_to_none=True)
    loss = reference_loss(model, groups, cfg, task, version)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.trainer.max_grad_norm)
    opt.step()
    return float(loss.detach())


def response_logprobs(
    model: nn.Module,
    tokens: torch.Tensor,
    prompt_len: int,
    temperature: float = 1.0,
    attention_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Log-prob (B, N) float32 of each response token ``tokens[:, P:]`` under ``model``: the
    full forward that the samplers' and the trainer's log-probs are checked against."""
    logits, _ = response_logits(model, tokens, prompt_len, attention_mask)
    logp = torch.log_softmax(logits.float() / temperature, dim=-1)  # (B, N, V)
    return logp.gather(2, tokens[:, prompt_len:, None]).squeeze(2)
