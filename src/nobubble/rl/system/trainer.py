"""The LLM producer's loss (:class:`GroupLoss`, settings ``RunConfig.trainer``, ``algo``,
``partial_rollouts``, ``token_drop_staleness``) for the one
:class:`~nobubble.rl.system.learner.Learner`, its evaluation and its step results.

``algo`` (all from :mod:`nobubble.rl.algo.losses`): ``grpo`` (group-relative advantages, PPO
clip against the behaviour policy), ``ppo`` (advantage ``R - V(s_t)``, value loss),
``decoupled-ppo`` (AReaL: trust region around the proximal policy), ``vtrace`` (IMPALA) and
``vtrace-ppo``. Lag controls are per token: staleness weights times the replay's IS weights,
folded into the advantages; tokens older than ``token_drop_staleness`` masked out; a KL
penalty to a reference policy. Whole-group versioning is asserted unless
``partial_rollouts``.
"""

from __future__ import annotations

import copy
import math
import time
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import torch
from torch import nn

from nobubble.rl.algo.advantages import grpo_advantages
from nobubble.rl.algo.losses import (
    aggregate_loss,
    kl_penalty,
    policy_gradient_loss,
    ppo_policy_loss,
)
from nobubble.rl.algo.staleness import check_group_versions, policy_lag, staleness_weight
from nobubble.rl.algo.vtrace import vtrace
from nobubble.rl.system.config.run import RunConfig
from nobubble.rl.system.learner import Learner, ShardGradients
from nobubble.rl.system.policies import prompt_attention_mask, response_logits, sample
from nobubble.rl.system.rollout import (
    check_token_versions,
    lag_histogram,
    response_versions,
    token_lag,
)
from nobubble.rl.system.tasks.spec import TaskSpec
from nobubble.rl.system.types import SampleGroup, Span

__all__ = [
    "TrainResult",
    "EvalResult",
    "GroupBatch",
    "GroupLoss",
    "evaluate_policy",
    "group_learner",
    "train_result",
]


@dataclass(frozen=True)
class TrainResult:
    """One optimizer step: the version it made (trainer version + 1), per trained group
    ``trainer version - policy version`` before the step, the loss's metrics, the busy span."""

    version: int
    staleness: list[int]
    metrics: dict[str, float]
    span: Span
    trained_by: dict[int, int] = field(default_factory=dict)  # group -> learner (empty: 0)
    token_staleness: dict[int, int] = field(default_factory=dict)  # lag -> response tokens
    # version -> digest of the weights the step started from and made (the stage worker's)
    weight_digests: dict[int, str] = field(default_factory=dict)


def _upcast(x: torch.Tensor) -> torch.Tensor:
    return x.to(torch.promote_types(x.dtype, torch.float32))


@dataclass(frozen=True)
class EvalResult:
    """Greedy decoding over the task's evaluation prompts: the share solved, the mean reward."""

    version: int
    accuracy: float
    mean_reward: float
    span: Span | None = field(default=None, compare=False)


@torch.no_grad()
def evaluate_policy(model: nn.Module, task: TaskSpec, version: int = 0) -> EvalResult:
    """Accuracy (``task.is_correct``) and mean reward of greedy responses on the task's
    evaluation set."""
    start = time.time()
    prompts = task.eval_prompts
    ids, mask = task.encode(prompts)
    gen = sample(
        model,
        ids,
        max_new_tokens=task.max_new_tokens,
        eos_id=task.tokenizer.eos_id,
        pad_id=task.tokenizer.pad_id,
        greedy=True,
        budgets=task.budgets(prompts),
        attention_mask=mask,
    )
    p = task.prompt_len
    responses = [task.decode(gen.tokens[i, p:].tolist()) for i in range(len(prompts))]
    correct = sum(task.is_correct(q, r) for q, r in zip(prompts, responses))
    reward = sum(task.reward(q, r) for q, r in zip(prompts, responses)) / len(prompts)
    span = Span("trainer", f"eval v{version}", start, time.time(), {"version": version})
    return EvalResult(version, correct / len(prompts), reward, span)


class GroupBatch(NamedTuple):
    """A batch for :class:`GroupLoss`: whole groups (each one policy version, unless partial
    rollouts) and optionally one weight per group (a replay's IS weights; None = all 1,
    multiplied with the staleness weights)."""

    groups: list[SampleGroup]
    weights: list[float] | None = None


class GroupLoss:
    """The LLM producer's loss (``RunConfig.algo``) on a :class:`GroupBatch`, for the
    :class:`~nobubble.rl.system.learner.Learner`; holds the KL penalty's reference policy
    (a frozen copy of the initial ``model``, refreshed every ``kl_refresh_every`` versions).
    ``cfg`` is the run: the trainer's settings are ``cfg.trainer``.
    """

    def __init__(self, *, task: TaskSpec, model: nn.Module, cfg: RunConfig) -> None:
        self.task, self.run, self.cfg = task, cfg, cfg.trainer
        self.reference = copy.deepcopy(model).eval() if self.cfg.kl_coef > 0 else None
        if self.reference is not None:
            self.reference.requires_grad_(False)

    def after_step(self, model: nn.Module, version: int) -> None:
        every = self.cfg.kl_refresh_every
        if self.reference is not None and every and version % every == 0:
            self.reference.load_state_dict(model.state_dict())

    def __call__(
        self, model: nn.Module, batch: GroupBatch, version: int
    ) -> tuple[torch.Tensor, ShardGradients]:
        """The loss on ``batch`` and the per-group staleness, the metrics and the number of
        response tokens (the loss is a token mean over them, so shards combine exactly when
        weighted by it). A group's staleness is that of its oldest tokens; weights and the
        token drop are per token."""
        groups, weights = batch
        samples = [s for g in groups for s in g.samples]
        g_size = len(groups[0].samples)
        if any(len(g.samples) != g_size for g in groups):
            raise ValueError("every group of a batch must have the same size")
        versions = [s.policy_version for s in samples]
        check_group_versions(versions, g_size)
        check_token_versions(groups, partial=self.run.partial_rollouts)
        staleness = policy_lag([g.policy_version for g in groups], version).tolist()
        tokens = torch.stack([s.tokens for s in samples])  # (B, P + N)
        mask = torch.stack([s.response_mask for s in samples]).float()  # (B, N)
        behav = torch.stack([s.behaviour_logprobs for s in samples])  # (B, N)
        rewards = torch.tensor([s.reward for s in samples], dtype=torch.float32)  # (B,)
        if weights is not None and len(weights) != len(groups):
            raise ValueError(f"{len(weights)} weights for {len(groups)} groups")
        w, mask, token_staleness = self._token_weights(samples, g_size, weights, mask, version)

        model.train()
        p = self.task.prompt_len
        attn = prompt_attention_mask(tokens, p, self.task.tokenizer.pad_id)  # (B, P + N)
        logits, values = response_logits(model, tokens, p, attn)  # (B, N, V)
        # at least fp32 (fp16/bf16 logits are upcast; an fp64 policy stays fp64)
        logp_all = torch.log_softmax(_upcast(logits), dim=-1)  # (B, N, V)
        actions = tokens[:, p:]  # (B, N)
        logp = logp_all.gather(2, actions[..., None]).squeeze(2)  # (B, N)
        loss, metrics = self._loss(logp, behav, values, rewards, mask, g_size, w)
        if self.reference is not None:
            with torch.no_grad():
                ref_logits, _ = response_logits(self.reference, tokens, p, attn)
                ref_all = torch.log_softmax(_upcast(ref_logits), dim=-1)  # (B, N, V)
                ref_logp = ref_all.gather(2, actions[..., None]).squeeze(2)  # (B, N)
            kl = aggregate_loss(kl_penalty(logp, ref_logp, "k3"), mask)
            loss = loss + self.cfg.kl_coef * kl
            metrics["kl_ref"] = float(kl.detach())
        entropy = aggregate_loss(-(logp_all.exp() * logp_all).sum(-1), mask)
        uniform_kl = aggregate_loss(-logp_all.mean(-1) - math.log(logp_all.shape[-1]), mask)
        loss = loss - self.cfg.entropy_coef * entropy + self.cfg.uniform_kl_coef * uniform_kl
        metrics.update(weight_mean=float((w * mask).sum() / mask.sum().clamp(min=1)))
        metrics.update(
            loss=float(loss.detach()), reward=float(rewards.mean()), entropy=float(entropy.detach())
        )
        return loss, ShardGradients(staleness, metrics, int(mask.sum()), token_staleness)

    def _token_weights(
        self,
        samples: list,
        g_size: int,
        weights: list[float] | None,
        mask: torch.Tensor,
        version: int,
    ) -> tuple[torch.Tensor, torch.Tensor, dict[int, int]]:
        """Per-token loss weights ``w`` (B, N): the staleness weight of each token's own age
        times its group's weight (``weights``, one per group); the mask (B, N) without the
        tokens past ``token_drop_staleness``; the kept tokens by staleness."""
        lag = token_lag(response_versions(samples), version)  # (B, N)
        drop = self.run.token_drop_staleness
        if drop is not None:
            mask = mask * (lag <= drop)  # (B, N)
        kind: Any = self.cfg.staleness_weighting  # checked by TrainerConfig
        w = staleness_weight(lag.to(torch.float32), kind)  # (B, N)
        if weights is not None:
            per_group = torch.tensor(weights, dtype=torch.float32)  # (B / g_size,)
            w = w * per_group.repeat_interleave(g_size)[:, None]
        return w, mask, lag_histogram(lag, mask)

    def _loss(
        self,
        logp: torch.Tensor,
        behav: torch.Tensor,
        values: torch.Tensor,
        rewards: torch.Tensor,
        mask: torch.Tensor,
        g_size: int,
        w: torch.Tensor,
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """The algorithm's loss; ``w`` (B, N) weights every token (folded into A): the
        algorithm's advantage (and value loss), then PPO's clip on it (``decoupled-ppo``:
        around the proximal policy, the weights before this step) or, for ``vtrace``, the
        plain policy gradient."""
        algo, clip = self.run.algo, self.cfg.clip
        vals = values * mask  # (B, N)
        value_loss = None
        if algo in ("grpo", "decoupled-ppo"):
            adv = grpo_advantages(rewards, g_size)[:, None]  # (B, 1)
        elif algo == "ppo":
            adv = (rewards[:, None] - vals).detach()  # (B, N) MC return minus V(s_t)
            value_loss = aggregate_loss((vals - rewards[:, None]).square(), mask)
        else:  # V-trace: the reward arrives at the last response token, discount 1
            last = mask.cumsum(1) == mask.sum(1, keepdim=True)
            step_rewards = torch.where(last & (mask > 0), rewards[:, None], 0.0)  # (B, N)
            discounts = mask.t()  # (N, B): the episode ends after the last valid token
            ret = vtrace(
                (logp - behav).t() * mask.t(),
                discounts,
                step_rewards.t(),
                vals.t(),
                torch.zeros(mask.shape[0]),
            )
            adv = ret.pg_advantages.t().detach()  # (B, N)
            value_loss = aggregate_loss((vals - ret.vs.t()).square(), mask)
        adv = adv * w  # (B, N)
        metrics: dict[str, float] = {}
        if algo == "vtrace":
            loss = policy_gradient_loss(logp, adv, mask)
        else:
            decoupled = algo == "decoupled-ppo"
            old, behav_logp = (logp.detach(), behav) if decoupled else (behav, None)
            res = ppo_policy_loss(logp, old, adv, mask, clip, clip, behav_logp=behav_logp)
            loss, metrics["clip_fraction"] = res.loss, float(res.clip_fraction)
        if value_loss is not None:
            loss = loss + self.cfg.value_coef * value_loss
            metrics["value_loss"] = float(value_loss.detach())
        return loss, metrics


def group_learner(*, task: TaskSpec, model: nn.Module, cfg: RunConfig) -> Learner[GroupLoss]:
    """The LLM producer's :class:`~nobubble.rl.system.learner.Learner`: ``model`` (a policy,
    ``forward -> (logits, values)``, see :func:`~nobubble.rl.system.policies.as_policy`)
    trained on :class:`GroupLoss` with Adam at ``cfg.trainer.lr``."""
    loss, t = GroupLoss(task=task, model=model, cfg=cfg), cfg.trainer
    return Learner(model, loss, lr=t.lr, max_grad_norm=t.max_grad_norm, delay_s=t.delay_s)


def train_result(
    learner: Learner[GroupLoss], groups: list[SampleGroup], shard: ShardGradients, start: float
) -> TrainResult:
    """A step's :class:`TrainResult` (version, staleness, metrics, busy span); a learner that
    pushed its gradient to learner 0 reports the version it computed on."""
    v, ids = learner.version, [g.group_id for g in groups]
    args: dict[str, Any]
    if learner.pushes_gradients:
        rank = learner.ctx.rank if learner.ctx is not None else 0
        name, args = f"grad on v{v} (learner {rank})", {"groups": ids}
    else:
        name, args = f"train v{v - 1}->v{v}", {"groups": ids, "max_lag": max(shard.staleness)}
        if shard.pushes:
            args["pushes"] = shard.pushes
    span = Span("trainer", name, start, time.time(), args)
    trained_by = {} if learner.ctx is None else dict.fromkeys(ids, learner.ctx.rank)
    return TrainResult(
        v, shard.staleness, shard.metrics, span, trained_by, token_staleness=shard.token_staleness
    )
