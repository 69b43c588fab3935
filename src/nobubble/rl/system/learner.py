"""The one learner of both producers (:class:`Learner`: the policy, its Adam optimizer, its
version and the aggregation over ``RunConfig.learners``; the loss is a choice) and the LLM
producer's loss (:class:`GroupLoss`: ``RunConfig.algo`` with the per-token lag controls).
Aggregations and lag controls: ``docs/rl/system.md``.
"""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any, NamedTuple

import torch
from torch import nn

from nobubble.distributed import DistContext
from nobubble.rl.algo.aggregation import (
    LocalSGD,
    ParameterServer,
    VersionedInbox,
    all_reduce_gradients,
    broadcast_parameters,
    filled_grads,
    send_versioned,
)
from nobubble.rl.algo.losses import (
    aggregate_loss,
    grpo_advantages,
    kl_penalty,
    policy_entropy,
    policy_gradient_loss,
    ppo_policy_loss,
)
from nobubble.rl.algo.staleness import check_group_versions, policy_lag, staleness_weight
from nobubble.rl.algo.vtrace import vtrace
from nobubble.rl.system.config import RunConfig
from nobubble.rl.system.policies import prompt_attention_mask, response_logits
from nobubble.rl.system.rollout import (
    check_token_versions,
    lag_histogram,
    response_versions,
    token_lag,
)
from nobubble.rl.system.tasks import TaskSpec
from nobubble.rl.system.types import SampleGroup, Span

__all__ = [
    "Learner",
    "ShardGradients",
    "TrainResult",
    "GroupBatch",
    "GroupLoss",
    "group_learner",
    "pushes_gradients",
]


def pushes_gradients(rank: int, aggregation: str) -> bool:
    """Whether learner ``rank`` sends its gradient to learner 0 and never steps an optimizer
    (its version is the one it computed on): one other than 0 in ``async`` / ``staleness``.
    The only learners that pull published weights."""
    return rank > 0 and aggregation in ("async", "staleness")


@dataclass(frozen=True)
class ShardGradients:
    """What one loss evaluation leaves besides the ``.grad`` tensors."""

    staleness: list[int]  # per trained group, learner version - policy version (may be [])
    metrics: dict[str, float]  # loss terms and diagnostics
    num_tokens: int  # loss elements: the token mean's denominator, the ``sync`` weight
    token_staleness: dict[int, int] = field(default_factory=dict)  # lag -> tokens
    # async / staleness on learner 0: (learner, staleness, weight) of each gradient applied
    pushes: list[tuple[int, int, float]] = field(default_factory=list)


class Learner:
    """Owns ``model`` (an ``nn.Module``, trained in place), its Adam optimizer (``lr``,
    ``adam_eps``) and the policy version (from 0). ``loss``: the objective, ``loss(model,
    batch, version) -> (scalar, ShardGradients)`` on the current parameters, whose
    ``after_step(model, version)`` runs after every new version (:class:`GroupLoss` refreshes
    its KL reference there); gradients are clipped to the global norm ``max_grad_norm``
    before every step; ``delay_s``: extra seconds per new version (a slower learner)."""

    def __init__(
        self,
        model: Any,
        loss: Any,
        *,
        lr: float,
        max_grad_norm: float,
        adam_eps: float = 1e-8,
        delay_s: float = 0.0,
    ) -> None:
        self.model, self.loss = model, loss
        self.max_grad_norm, self.delay_s = max_grad_norm, delay_s
        self.optimizer: torch.optim.Optimizer = torch.optim.Adam(
            model.parameters(), lr=lr, eps=adam_eps
        )
        self.version = 0
        self.ctx: DistContext | None = None
        self.aggregation = "sync"
        self._server: ParameterServer | None = None
        self._local_sgd: LocalSGD | None = None
        self._params = [p for p in model.parameters() if p.requires_grad]

    def join(self, ctx: DistContext, aggregation: str, local_sgd_every: int = 1) -> None:
        """Become learner ``ctx.rank`` of ``ctx.world_size``: start from learner 0's
        parameters and combine gradients by ``aggregation`` (``RunConfig.aggregation``)."""
        self.ctx, self.aggregation = ctx, aggregation
        broadcast_parameters(self._params, ctx)  # every learner starts from learner 0's
        if aggregation in ("async", "staleness") and ctx.rank == 0:  # serves its own model
            self._server = ParameterServer(
                self._params,
                optimizer=self.optimizer,
                staleness_kind="inverse" if aggregation == "staleness" else "none",
            )
            # published version -> server version then (what a push was computed on)
            self._server_version_at = {self.version: 0}
        elif aggregation == "local-sgd":
            self._local_sgd = LocalSGD(self._params, sync_every=local_sgd_every, ctx=ctx)

    @property
    def pushes_gradients(self) -> bool:
        """:func:`pushes_gradients` of this learner's rank (0 alone) and aggregation."""
        return pushes_gradients(0 if self.ctx is None else self.ctx.rank, self.aggregation)

    def compute_gradients(self, batch: Any) -> ShardGradients:
        """Forward and backward of the loss on ``batch``: sets every ``.grad``."""
        loss, shard = self.loss(self.model, batch, self.version)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        return shard

    def clip_gradients(self) -> None:
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.max_grad_norm)

    def finish_step(self) -> None:
        """After new parameters: the delay, the version, the loss's ``after_step``."""
        if self.delay_s:
            time.sleep(self.delay_s)
        self.version += 1
        self.loss.after_step(self.model, self.version)

    def update(self, minibatches: Iterable[Any]) -> ShardGradients:
        """One optimizer step per minibatch (each aggregated over the learners), then one
        new version (none on a learner that :attr:`pushes_gradients`). Returns the
        minibatch's :class:`ShardGradients` (metrics averaged when there are several)."""
        if self.aggregation in ("async", "staleness"):
            (batch,) = minibatches  # a parameter server applies one batch per version
            return self._push(batch) if self.pushes_gradients else self._serve(batch)
        shards = [self._step(batch) for batch in minibatches]
        self.finish_step()
        if self._local_sgd is not None:
            shards[-1].metrics["params_averaged"] = float(self._local_sgd.after_step())
        if len(shards) == 1:
            return shards[0]
        keys = shards[0].metrics
        mean = {k: sum(s.metrics[k] for s in shards) / len(shards) for k in keys}
        return ShardGradients([], mean, sum(s.num_tokens for s in shards))

    def _step(self, batch: Any) -> ShardGradients:
        shard = self.compute_gradients(batch)
        if self.aggregation == "sync" and self.ctx is not None:
            all_reduce_gradients(self._params, self.ctx, op="mean", weight=float(shard.num_tokens))
        self.clip_gradients()
        self.optimizer.step()
        return shard

    def _push(self, batch: Any) -> ShardGradients:
        """A learner other than 0: gradient on the weights it holds, sent to learner 0."""
        assert self.ctx is not None  # joined
        shard = self.compute_gradients(batch)
        self.clip_gradients()
        send_versioned(self.ctx, filled_grads(self._params), self.version, 0)
        return shard

    def _serve(self, batch: Any) -> ShardGradients:
        """Learner 0 in async / staleness: its own gradient and one push from every other
        learner, applied in arrival order; then one new version."""
        server, ctx = self._server, self.ctx
        assert server is not None and ctx is not None  # built by join for learner 0
        inbox = VersionedInbox(ctx, self._params, range(1, ctx.world_size))
        base = server.version
        shard = self.compute_gradients(batch)
        self.clip_gradients()
        own = [g.clone() for g in filled_grads(self._params)]  # a push overwrites .grad
        pushes: list[tuple[int, int, float]] = []  # (learner, staleness, weight) in order

        def apply(learner: int, version: int, grads: Any) -> None:
            # learner 0 pushes at a server version, the others at the published one they used
            res = server.push(grads, version if learner == 0 else self._server_version_at[version])
            pushes.append((learner, res.staleness, res.weight))

        for item in inbox.arrived():  # what arrived while this learner computed goes first
            apply(*item)
        apply(0, base, own)
        while len(pushes) < ctx.world_size:
            apply(*inbox.get())
        inbox.close()
        self.finish_step()
        self._server_version_at[self.version] = server.version
        lags = [s for _, s, _ in pushes]
        shard.metrics.update(
            push_staleness_max=float(max(lags)),
            push_staleness_mean=sum(lags) / len(lags),
            push_weight_mean=sum(w for _, _, w in pushes) / len(pushes),
        )
        return replace(shard, pushes=pushes)


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


def _token_logp(logits: torch.Tensor, actions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The log-softmax of ``logits`` (B, N, V), at least fp32 (fp16/bf16 upcast, fp64 kept),
    and its (B, N) entries at ``actions``."""
    logp_all = torch.log_softmax(logits.to(torch.promote_types(logits.dtype, torch.float32)), -1)
    return logp_all, logp_all.gather(2, actions[..., None]).squeeze(2)


class GroupBatch(NamedTuple):
    """A batch for :class:`GroupLoss`: whole groups (each one policy version, unless partial
    rollouts) and optionally one weight per group (a replay's IS weights; None = all 1,
    multiplied with the staleness weights)."""

    groups: list[SampleGroup]
    weights: list[float] | None = None


class GroupLoss:
    """The LLM producer's loss on a :class:`GroupBatch` (``cfg.algo``: ``grpo``, ``ppo``,
    ``decoupled-ppo``, ``vtrace``, ``vtrace-ppo``; settings ``cfg.trainer``); holds the KL
    penalty's reference policy, a frozen copy of the initial ``model`` refreshed every
    ``kl_refresh_every`` versions. Whole-group versioning is asserted unless
    ``cfg.partial_rollouts``."""

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
        if weights is not None and len(weights) != len(groups):
            raise ValueError(f"{len(weights)} weights for {len(groups)} groups")
        group_versions = check_group_versions([s.policy_version for s in samples], g_size)
        check_token_versions(groups, partial=self.run.partial_rollouts)
        staleness = policy_lag(group_versions, version).tolist()
        tokens = torch.stack([s.tokens for s in samples])  # (B, P + N)
        mask = torch.stack([s.response_mask for s in samples]).float()  # (B, N)
        behav = torch.stack([s.behaviour_logprobs for s in samples])  # (B, N)
        rewards = torch.tensor([s.reward for s in samples], dtype=torch.float32)  # (B,)
        # per-token weights: the staleness weight of each token's own age times its group's
        # weight; tokens past token_drop_staleness are masked out
        lag = token_lag(response_versions(samples), version)  # (B, N)
        if self.run.token_drop_staleness is not None:
            mask = mask * (lag <= self.run.token_drop_staleness)  # (B, N)
        kind: Any = self.cfg.staleness_weighting  # checked by TrainerConfig
        w = staleness_weight(lag.to(torch.float32), kind)  # (B, N)
        if weights is not None:
            per_group = torch.tensor(weights, dtype=torch.float32)  # (B / g_size,)
            w = w * per_group.repeat_interleave(g_size)[:, None]

        model.train()
        p = self.task.prompt_len
        attn = prompt_attention_mask(tokens, p, self.task.tokenizer.pad_id)  # (B, P + N)
        logits, values = response_logits(model, tokens, p, attn)  # (B, N, V)
        logp_all, logp = _token_logp(logits, tokens[:, p:])  # (B, N, V), (B, N)
        loss, metrics = self._loss(logp, behav, values, rewards, mask, g_size, w)
        if self.reference is not None:
            with torch.no_grad():
                ref_logits, _ = response_logits(self.reference, tokens, p, attn)
                _, ref_logp = _token_logp(ref_logits, tokens[:, p:])  # (B, N)
            kl = aggregate_loss(kl_penalty(logp, ref_logp, "k3"), mask)
            loss = loss + self.cfg.kl_coef * kl
            metrics["kl_ref"] = float(kl.detach())
        entropy = aggregate_loss(policy_entropy(logp_all), mask)
        uniform_kl = aggregate_loss(-logp_all.mean(-1) - math.log(logp_all.shape[-1]), mask)
        loss = loss - self.cfg.entropy_coef * entropy + self.cfg.uniform_kl_coef * uniform_kl
        metrics.update(weight_mean=float((w * mask).sum() / mask.sum().clamp(min=1)))
        metrics.update(
            loss=float(loss.detach()), reward=float(rewards.mean()), entropy=float(entropy.detach())
        )
        token_staleness = lag_histogram(lag, mask)
        return loss, ShardGradients(staleness, metrics, int(mask.sum()), token_staleness)

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


def group_learner(*, task: TaskSpec, model: nn.Module, cfg: RunConfig) -> Learner:
    """The LLM producer's :class:`~nobubble.rl.system.learner.Learner`: ``model`` (a policy,
    ``forward -> (logits, values)``, see :func:`~nobubble.rl.system.policies.as_policy`)
    trained on :class:`GroupLoss` with Adam at ``cfg.trainer.lr``."""
    loss, t = GroupLoss(task=task, model=model, cfg=cfg), cfg.trainer
    return Learner(model, loss, lr=t.lr, max_grad_norm=t.max_grad_norm, delay_s=t.delay_s)
