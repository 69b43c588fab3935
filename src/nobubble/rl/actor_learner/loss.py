"""The environment producer's loss: V-trace targets and a PPO-clip (or plain V-trace) loss.

For each minibatch of environments of a batch ``(T, B)``, with the *current* parameters:

    vs, A = vtrace_from_logits(mu_logits, pi_logits, a, gamma * (1 - done), r, V, V_T)
    policy loss = PPO clip of pi / mu on A (``loss="ppo"``, APPO)  or  -A log pi ("vtrace")
    value loss  = 1/2 (vs - V)^2,   entropy bonus  H(pi)

The learner (:func:`env_learner`) takes one optimizer step per minibatch and makes one new
policy version per update.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch import nn

from nobubble.rl.actor_learner.config import EnvRunConfig
from nobubble.rl.actor_learner.model import PolicyModel
from nobubble.rl.actor_learner.trajectory import TrajectoryBatch
from nobubble.rl.algo.losses import policy_gradient_loss, ppo_policy_loss
from nobubble.rl.algo.vtrace import VTraceReturns, vtrace_from_logits
from nobubble.rl.system.learner import Learner, ShardGradients

__all__ = ["VTraceLoss", "env_learner", "minibatches", "vtrace_targets"]


def vtrace_targets(
    logits: torch.Tensor, values: torch.Tensor, batch: TrajectoryBatch, gamma: float, lambda_: float
) -> VTraceReturns:
    """V-trace on the model's output over ``batch.obs``: ``logits (T + 1, B, A)``, ``values
    (T + 1, B)``, with gradient; the discount is 0 at dones, ``V(x_T)`` the bootstrap."""
    return vtrace_from_logits(
        behaviour_policy_logits=batch.behaviour_logits,
        target_policy_logits=logits[:-1],
        actions=batch.actions,
        discounts=gamma * (1.0 - batch.dones),
        rewards=batch.rewards,
        values=values[:-1],
        bootstrap_value=values[-1],
        lambda_=lambda_,
    )


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
        logits, values = model(batch.obs)  # (T + 1, b, A), (T + 1, b)
        out = vtrace_targets(logits, values, batch, c.gamma, c.vtrace_lambda)
        logp = out.target_action_log_probs
        assert logp is not None  # set by vtrace_from_logits
        behaviour_logp = logp.detach() - out.log_rhos  # (T, b)
        adv = (out.pg_advantages - out.pg_advantages.mean()) / (out.pg_advantages.std() + 1e-8)
        mask = torch.ones_like(logp).T  # (b, T): every step counts
        if c.loss == "ppo":
            result = ppo_policy_loss(logp.T, behaviour_logp.T, adv.T, mask, c.clip, c.clip)
            policy_loss, clip_fraction = result.loss, result.clip_fraction
        else:
            policy_loss = policy_gradient_loss(logp.T, adv.T, mask)
            clip_fraction = torch.zeros(())
        value_loss = 0.5 * (out.vs - values[:-1]).square().mean()
        logits = logits[:-1]  # (T, b, A)
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
