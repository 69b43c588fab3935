"""The RL algorithm toolbox: pure functions and small classes, below the running system.

GRPO advantages, policy losses (PPO with dual clip, decoupled PPO with its truncated
behaviour weight, plain PG, KL penalties), V-trace (GAE is its on-policy case), policy lag
and staleness weights, prioritized replay, gradient aggregation over torch.distributed and
the two presets (conservative, aggressive). Each module's ``__all__`` has its result types
and helpers too; the slow references the tests check these against live beside the tests
(``tests/rl/algo/reference.py``, written from the papers' formulas, sharing no code).
Names are imported on first use, so ``import nobubble.rl.algo.presets`` loads no torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from nobubble.rl.algo.advantages import grpo_advantages
    from nobubble.rl.algo.aggregation import (
        LocalSGD,
        ParameterServer,
        all_reduce_gradients,
    )
    from nobubble.rl.algo.losses import (
        PolicyLossResult,
        aggregate_loss,
        decoupled_ppo_loss,
        kl_penalty,
        policy_gradient_loss,
        ppo_policy_loss,
    )
    from nobubble.rl.algo.presets import RLAlgorithmConfig, aggressive, conservative, get_preset
    from nobubble.rl.algo.replay import PrioritizedReplayBuffer, linear_beta
    from nobubble.rl.algo.staleness import check_group_versions, policy_lag, staleness_weight
    from nobubble.rl.algo.vtrace import VTraceReturns, vtrace, vtrace_from_logits

_NAMES = {
    "grpo_advantages": "nobubble.rl.algo.advantages",
    "PolicyLossResult": "nobubble.rl.algo.losses",
    "aggregate_loss": "nobubble.rl.algo.losses",
    "ppo_policy_loss": "nobubble.rl.algo.losses",
    "decoupled_ppo_loss": "nobubble.rl.algo.losses",
    "policy_gradient_loss": "nobubble.rl.algo.losses",
    "kl_penalty": "nobubble.rl.algo.losses",
    "VTraceReturns": "nobubble.rl.algo.vtrace",
    "vtrace": "nobubble.rl.algo.vtrace",
    "vtrace_from_logits": "nobubble.rl.algo.vtrace",
    "policy_lag": "nobubble.rl.algo.staleness",
    "staleness_weight": "nobubble.rl.algo.staleness",
    "check_group_versions": "nobubble.rl.algo.staleness",
    "PrioritizedReplayBuffer": "nobubble.rl.algo.replay",
    "linear_beta": "nobubble.rl.algo.replay",
    "all_reduce_gradients": "nobubble.rl.algo.aggregation",
    "LocalSGD": "nobubble.rl.algo.aggregation",
    "ParameterServer": "nobubble.rl.algo.aggregation",
    "RLAlgorithmConfig": "nobubble.rl.algo.presets",
    "conservative": "nobubble.rl.algo.presets",
    "aggressive": "nobubble.rl.algo.presets",
    "get_preset": "nobubble.rl.algo.presets",
}
__all__ = [
    "grpo_advantages",
    "PolicyLossResult",
    "aggregate_loss",
    "ppo_policy_loss",
    "decoupled_ppo_loss",
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
    "RLAlgorithmConfig",
    "conservative",
    "aggressive",
    "get_preset",
]


def __getattr__(name: str) -> Any:
    if name in _NAMES:
        return getattr(importlib.import_module(_NAMES[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
