"""The environment producer's loss: V-trace targets and a PPO-clip (or plain V-trace) loss.

One update takes a batch of trajectories ``(T, B)`` and, for each epoch and minibatch of
environments, computes with the *current* parameters

    vs, A = vtrace_from_logits(mu_logits, pi_logits, a, gamma * (1 - done), r, V, V_T)
    policy loss = PPO clip of pi / mu on A (``loss="ppo"``, APPO)  or  -A log pi ("vtrace")
    value loss  = 1/2 (vs - V)^2,   entropy bonus  H(pi)

(:mod:`nobubble.rl.algo.vtrace`, :mod:`nobubble.rl.algo.losses`). The learner
(:func:`env_learner`) takes one optimizer step per minibatch and makes one new policy
version per update; a trajectory's lag is the version at update time minus the version that
generated it.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from nobubble.rl.actor_learner.config import EnvRunConfig
from nobubble.rl.actor_learner.model import PolicyModel
from nobubble.rl.actor_learner.trajectory import TrajectoryBatch
from nobubble.rl.algo.losses import policy_gradient_loss, ppo_policy_loss
from nobubble.rl.algo.vtrace import VTraceFromLogitsReturns, vtrace_from_logits
from nobubble.rl.system.learner import Learner, ShardGradients

__all__ = ["VTraceLoss", "VTraceTargets", "env_learner", "minibatches", "vtrace_targets"]


@dataclass(frozen=True)
class VTraceTargets:
    """V-trace under the current model for a batch ``(T, B)``.

    Attributes:
        vtrace: the targets ``vs``, ``pg_advantages`` (detached) and the actions'
            log-probs under both policies (the learner's, ``target_action_log_probs``, with
            gradient).
        values: ``(T, B)`` V(x_t), with gradient.
        logits: ``(T, B, A)`` pi's logits, with gradient (for the entropy).
    """

    vtrace: VTraceFromLogitsReturns
    values: torch.Tensor
    logits: torch.Tensor


def vtrace_targets(
    model: nn.Module, batch: TrajectoryBatch, gamma: float, lambda_: float
) -> VTraceTargets:
    """One forward pass over ``obs (T + 1, B, D)`` and V-trace on it (discount 0 at dones)."""
    logits, values = model(batch.obs)  # (T + 1, B, A), (T + 1, B)
    out = vtrace_from_logits(
        behaviour_policy_logits=batch.behaviour_logits,
        target_policy_logits=logits[:-1],
        actions=batch.actions,
        discounts=gamma * (1.0 - batch.dones),
        rewards=batch.rewards,
        values=values[:-1],
        bootstrap_value=values[-1],
        lambda_=lambda_,
    )
    return VTraceTargets(out, values[:-1], logits[:-1])


class VTraceLoss:
    """The environment producer's loss (``EnvRunConfig.loss``: ``ppo`` = APPO, ``vtrace``)
    on a :class:`TrajectoryBatch` ``(T, b)``, for the
    :class:`~nobubble.rl.system.learner.Learner`: advantages normalised per minibatch,
    every step counts."""

    def __init__(self, config: EnvRunConfig) -> None:
        self.config = config

    def after_step(self, model: nn.Module, version: int) -> None:
        pass

    def __call__(
        self, model: nn.Module, batch: TrajectoryBatch, version: int
    ) -> tuple[torch.Tensor, ShardGradients]:
        c = self.config
        targets = vtrace_targets(model, batch, c.gamma, c.vtrace_lambda)
        out = targets.vtrace
        logp, behaviour_logp = out.target_action_log_probs, out.behaviour_action_log_probs
        adv = (out.pg_advantages - out.pg_advantages.mean()) / (out.pg_advantages.std() + 1e-8)
        mask = torch.ones_like(logp).T  # (b, T): every step counts
        if c.loss == "ppo":
            result = ppo_policy_loss(logp.T, behaviour_logp.T, adv.T, mask, c.clip, c.clip)
            policy_loss, clip_fraction = result.loss, result.clip_fraction
        else:
            policy_loss = policy_gradient_loss(logp.T, adv.T, mask)
            clip_fraction = torch.zeros(())
        value_loss = 0.5 * (out.vs - targets.values).square().mean()
        logits = targets.logits  # (T, b, A)
        entropy = -(F.softmax(logits, -1) * F.log_softmax(logits, -1)).sum(-1).mean()
        loss = policy_loss + c.value_coef * value_loss - c.entropy_coef * entropy
        terms = torch.stack([policy_loss, value_loss, entropy, clip_fraction]).tolist()
        metrics = dict(zip(("policy_loss", "value_loss", "entropy", "clip_fraction"), terms))
        return loss, ShardGradients([], metrics, mask.numel())


def env_learner(model: PolicyModel, config: EnvRunConfig) -> Learner[VTraceLoss]:
    """The environment producer's :class:`~nobubble.rl.system.learner.Learner` (Adam,
    ``eps=1e-5``)."""
    return Learner(
        model,
        VTraceLoss(config),
        lr=config.lr,
        max_grad_norm=config.max_grad_norm,
        adam_eps=1e-5,
    )


def minibatches(
    batch: TrajectoryBatch, config: EnvRunConfig, generator: torch.Generator
) -> Iterator[TrajectoryBatch]:
    """``config.epochs`` passes over ``batch``, each in ``config.minibatches`` random
    column (environment) subsets: one optimizer step each, one version in all."""
    num_envs = batch.actions.shape[1]
    for _ in range(config.epochs):
        order = torch.randperm(num_envs, generator=generator)
        for index in order.chunk(config.minibatches):
            yield batch.columns(index)
