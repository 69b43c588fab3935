"""The RL algorithm toolbox: pure functions and small classes, below the running system.

Advantages (GRPO, GAE), policy losses (PPO with dual clip, decoupled PPO, plain PG, KL
penalties), V-trace, off-policy corrections, staleness weights, prioritized replay, gradient
aggregation and the two presets (conservative, aggressive).
"""

from __future__ import annotations

from nobubble.rl.algo.advantages import GAEReturns, GRPOScale, gae, grpo_advantages
from nobubble.rl.algo.aggregation import (
    AggregatedGradients,
    AggregationMode,
    AsyncApplyResult,
    LocalSGD,
    ParameterServer,
    PushResult,
    all_reduce_gradients,
    all_reduce_parameters,
    average_parameters_,
    mean_gradients,
    run_async_parameter_server,
    staleness_weighted_gradients,
    sum_gradients,
)
from nobubble.rl.algo.corrections import (
    ISLevel,
    OffPolicyCorrection,
    importance_log_ratio,
    mask_outside_band,
    off_policy_correction,
    truncated_importance_weights,
)
from nobubble.rl.algo.losses import (
    LOSS_AGG_MODES,
    LossAgg,
    PolicyLossResult,
    aggregate_loss,
    decoupled_ppo_loss,
    kl_penalty,
    policy_gradient_loss,
    ppo_policy_loss,
)
from nobubble.rl.algo.presets import (
    PRESET_NAMES,
    RLAlgorithmConfig,
    aggressive,
    conservative,
    get_preset,
)
from nobubble.rl.algo.replay import (
    MinTree,
    PrioritizedReplayBuffer,
    ReplaySample,
    SumTree,
    linear_beta,
    priority_from_advantages,
    priority_from_reward_variance,
)
from nobubble.rl.algo.staleness import (
    StalenessKind,
    StalenessSummary,
    check_group_versions,
    fresh_mask,
    is_sync_step,
    policy_lag,
    staleness_weight,
    summarize_staleness,
)
from nobubble.rl.algo.vtrace import (
    VTraceFromLogitsReturns,
    VTraceReturns,
    vtrace,
    vtrace_from_logits,
)

__all__ = [
    "AggregatedGradients",
    "AggregationMode",
    "AsyncApplyResult",
    "run_async_parameter_server",
    "LocalSGD",
    "ParameterServer",
    "PushResult",
    "all_reduce_gradients",
    "all_reduce_parameters",
    "average_parameters_",
    "mean_gradients",
    "staleness_weighted_gradients",
    "sum_gradients",
    "GAEReturns",
    "GRPOScale",
    "gae",
    "grpo_advantages",
    "ISLevel",
    "OffPolicyCorrection",
    "importance_log_ratio",
    "mask_outside_band",
    "off_policy_correction",
    "truncated_importance_weights",
    "LOSS_AGG_MODES",
    "LossAgg",
    "PolicyLossResult",
    "aggregate_loss",
    "decoupled_ppo_loss",
    "kl_penalty",
    "policy_gradient_loss",
    "ppo_policy_loss",
    "PRESET_NAMES",
    "RLAlgorithmConfig",
    "aggressive",
    "conservative",
    "get_preset",
    "MinTree",
    "PrioritizedReplayBuffer",
    "ReplaySample",
    "SumTree",
    "linear_beta",
    "priority_from_advantages",
    "priority_from_reward_variance",
    "StalenessKind",
    "StalenessSummary",
    "check_group_versions",
    "fresh_mask",
    "is_sync_step",
    "policy_lag",
    "staleness_weight",
    "summarize_staleness",
    "VTraceFromLogitsReturns",
    "VTraceReturns",
    "vtrace",
    "vtrace_from_logits",
]
