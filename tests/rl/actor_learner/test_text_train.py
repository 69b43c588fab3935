"""Multi-turn text environments learn under the actor-learner core.

- guess the number (1-7, 3 turns, told higher / lower): under the seed architecture the
  character transformer goes from its starting success rate (about 0.25: a random character
  per turn; a random number in range would score 0.37) to a greedy success rate of at
  least 0.8 over 100 episodes. Any policy that ignores the replies scores at most 3/7, so
  0.8 means it reads them.
- the other architectures run a text env end to end (the impala actors build the text
  policy themselves from the config's factory).
"""

from __future__ import annotations

from statistics import mean

import gymnasium  # noqa: F401 - a hard dependency: a broken install fails here
import pytest

from nobubble.rl import train
from nobubble.rl.actor_learner.model import evaluate
from nobubble.rl.actor_learner.text import guess_number_odds, text_env_config


@pytest.mark.long
def test_guess_the_number_learns_from_chance_to_0_8_under_seed() -> None:
    config = text_env_config("guess-number", arch="seed", seed=0, time_budget_s=40.0)
    odds = guess_number_odds(7, 3)
    start = mean(evaluate(None, config, 400, seed=12_345, sampled=True))  # the untrained policy
    assert 0.12 <= start <= odds.random_guess, start  # near chance
    result = train(config)
    assert result.reached_target, (
        f"success {result.eval_mean_return:.2f} < 0.8 after {result.env_steps} steps / "
        f"{result.wall_s:.0f}s (started at {start:.2f})"
    )
    assert result.eval_mean_return >= 0.8 > odds.blind_best
    assert len(result.eval_returns) == 100
    assert result.ledger.ok and result.staleness_max <= config.max_staleness


@pytest.mark.parametrize("arch", ["impala", "sample-factory"])
def test_the_other_architectures_run_a_text_env_end_to_end(arch: str) -> None:
    config = text_env_config(
        "guess-number", arch=arch, actors=1, envs_per_actor=4, max_env_steps=1_500,
        target_return=None, eval_episodes=8, time_budget_s=30.0,
    )  # fmt: skip
    result = train(config)
    assert result.env == "guess-number" and result.env_steps >= 1_500
    assert result.steps >= 1 and result.ledger.ok
    assert all(r in (0.0, 1.0) for r in result.eval_returns)  # a return is a success
