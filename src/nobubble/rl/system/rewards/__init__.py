"""Rewards: weighted reward sources (:mod:`.rewarder`), the client of a reward service over
HTTP (:mod:`.remote`) and a reference server for it (:mod:`.server`)."""

from __future__ import annotations

from nobubble.rl.system.rewards.remote import RemoteReward, RemoteRewardError
from nobubble.rl.system.rewards.rewarder import (
    InjectedRewardFailure,
    Rewarder,
    RewardError,
    RewardFailure,
    RewardSource,
    parse_reward,
)
from nobubble.rl.system.rewards.server import RewardServer, serve_rewards

__all__ = [
    "RewardError",
    "InjectedRewardFailure",
    "RewardFailure",
    "RewardSource",
    "parse_reward",
    "Rewarder",
    "RemoteReward",
    "RemoteRewardError",
    "RewardServer",
    "serve_rewards",
]
