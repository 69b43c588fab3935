"""A harder control task: Acrobot-v1 (reward -1 per step until the tip swings up, at most 500
steps) learns under the seed architecture, from the untrained policy's -500 (it never swings
up) to the spec's reward threshold of -100, in a short run."""

from __future__ import annotations

import gymnasium  # noqa: F401 - a hard dependency: a broken install fails here
import pytest

from nobubble.rl import EnvRunConfig, train
from nobubble.rl.actor_learner.model import evaluate


@pytest.mark.long
def test_acrobot_learns_from_the_initial_policy_to_minus_100() -> None:
    config = EnvRunConfig(
        env="Acrobot-v1", arch="seed", actors=2, envs_per_actor=8, target_return=-100.0,
        time_budget_s=30.0, eval_every_s=2.0, seed=0,
    )  # fmt: skip
    start = evaluate(None, config)  # the untrained policy train() starts from
    start_mean = sum(start) / len(start)
    result = train(config)
    assert result.eval_mean_return >= -100.0, (
        f"eval return {result.eval_mean_return:.0f} after {result.env_steps} steps / "
        f"{result.wall_s:.0f}s (untrained: {start_mean:.0f})"
    )
    assert result.eval_mean_return - start_mean >= 250.0  # a clear margin over the start
    assert result.ledger.ok and result.staleness_max <= config.max_staleness
