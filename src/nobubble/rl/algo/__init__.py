"""The RL algorithm toolbox below the running system: GRPO advantages, policy losses, V-trace
(GAE is its on-policy case), staleness weights, prioritized replay, gradient aggregation."""

from __future__ import annotations

from nobubble.rl.algo.aggregation import (
    LocalSGD,
    ParameterServer,
    all_reduce_gradients,
)
from nobubble.rl.algo.losses import (
    PolicyLossResult,
    aggregate_loss,
    grpo_advantages,
    kl_penalty,
    policy_gradient_loss,
    ppo_policy_loss,
)
from nobubble.rl.algo.replay import PrioritizedReplayBuffer, linear_beta
from nobubble.rl.algo.staleness import check_group_versions, policy_lag, staleness_weight
from nobubble.rl.algo.vtrace import VTraceReturns, vtrace, vtrace_from_logits

__all__ = [
    "grpo_advantages",
    "PolicyLossResult",
    "aggregate_loss",
    "ppo_policy_loss",
    "policy_gradient_loss",
    "kl_penalty",
    "VTraceReturns",
    "vtrace",
    "vtrace_from_logits",
    "policy_lag",
    "staleness_weight",
    "check_group_versions",
    "PrioritizedReplayBuffer",
    "linear_beta",
    "all_reduce_gradients",
    "LocalSGD",
    "ParameterServer",
]
