"""Asynchronous RL and the algorithmic corrections it needs (see DESIGN.md, ``nobubble.rl``).

The algorithm library (issue 8) is exported here: advantages (GRPO, GAE), policy losses (PPO
with dual clip, decoupled PPO, plain PG, KL penalties), V-trace, off-policy corrections,
staleness weights, prioritized replay, gradient aggregation and the two presets.
"""

from __future__ import annotations

from nobubble.rl.advantages import GAEReturns, GRPOScale, gae, grpo_advantages
from nobubble.rl.losses import (
    LOSS_AGG_MODES,
    LossAgg,
    PolicyLossResult,
    aggregate_loss,
    decoupled_ppo_loss,
    kl_penalty,
    policy_gradient_loss,
    ppo_policy_loss,
)
from nobubble.rl.vtrace import VTraceFromLogitsReturns, VTraceReturns, vtrace, vtrace_from_logits

__all__ = [
    "GAEReturns",
    "GRPOScale",
    "gae",
    "grpo_advantages",
    "LOSS_AGG_MODES",
    "LossAgg",
    "PolicyLossResult",
    "aggregate_loss",
    "decoupled_ppo_loss",
    "kl_penalty",
    "policy_gradient_loss",
    "ppo_policy_loss",
    "VTraceFromLogitsReturns",
    "VTraceReturns",
    "vtrace",
    "vtrace_from_logits",
]
