"""Rewards: weighted reward sources, a remote reward service and its reference server.

- :mod:`.rewarder` - :class:`Rewarder` scores groups from weighted sources (the task's
  reward, functions by import path), with retries and recorded failures;
- :mod:`.remote` - :class:`RemoteReward`, the client of a reward service over HTTP;
- :mod:`.server` - :func:`serve_rewards`, a small reference service.
"""

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
