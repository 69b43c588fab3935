"""End-to-end runs on CartPole-v1: each architecture learns, lag stays bounded, the ledger is
whole, and a dead actor ends the run with its error naming it.

``make test`` bounds learning by env steps and asks for movement: after 20,000 steps the
training return (last 20 episodes, sampled) is at least twice the first one (measured 5-10x
on every architecture and seed). The long tier runs each architecture to a greedy return of
200 (a random policy scores about 20) within bounded steps and seconds.
"""

from __future__ import annotations

from typing import Any

import gymnasium
import pytest

from nobubble.rl import EnvRunConfig, WorkerError, train

TARGET = 200.0


@pytest.mark.parametrize("arch", ["impala", "seed", "sample-factory"])
def test_each_architecture_raises_the_training_return_within_20k_steps(arch: str) -> None:
    config = EnvRunConfig(
        arch=arch, actors=2, envs_per_actor=8, target_return=None, max_staleness=2,
        max_env_steps=20_000, time_budget_s=600.0, seed=1,  # the seconds: a hang guard only
    )  # fmt: skip
    result = train(config)
    returns = [p.train_return for p in result.curve if p.train_return is not None]
    assert result.env_steps >= 20_000, "stopped by the hang guard, not by the step bound"
    assert returns[-1] >= 2 * returns[0], returns
    assert result.staleness_max <= config.max_staleness and result.ledger.ok


@pytest.mark.long
@pytest.mark.parametrize("arch", ["impala", "seed", "sample-factory"])
def test_each_architecture_learns_cartpole_to_the_target(arch: str) -> None:
    config = EnvRunConfig(
        arch=arch, actors=2, envs_per_actor=8, target_return=TARGET, max_staleness=2,
        max_env_steps=150_000, time_budget_s=60.0, eval_every_s=2.0, seed=1,
    )  # fmt: skip
    result = train(config)
    assert result.reached_target, (
        f"{arch}: eval return {result.eval_mean_return:.0f} < {TARGET} after "
        f"{result.env_steps} steps / {result.wall_s:.0f}s"
    )
    assert result.eval_mean_return >= TARGET
    assert result.staleness_max <= config.max_staleness  # lag bounded as configured
    assert result.ledger.ok
    assert result.ledger.generated == result.ledger.trained + sum(result.ledger.dropped.values())
    assert sum(result.staleness_hist.values()) == result.trained_samples  # env steps by lag
    assert result.env_steps <= config.max_env_steps + 4 * 8 * 32 * config.actors
    assert 0.0 <= result.idle_ratio["learner"] <= 1.0


def test_impala_drops_what_is_older_than_max_staleness_and_accounts_for_it() -> None:
    config = EnvRunConfig(
        arch="impala", actors=2, envs_per_actor=4, max_staleness=0, target_return=None,
        max_env_steps=6_000, time_budget_s=30.0, seed=2,
    )  # fmt: skip
    result = train(config)
    assert set(result.staleness_hist) == {0}  # only on-policy data was used
    assert result.ledger.dropped["stale"] > 0  # actors ran ahead of the learner
    assert result.ledger.ok


class _Boom(gymnasium.Wrapper):  # type: ignore[misc]
    """CartPole that raises on its 50th step."""

    def __init__(self) -> None:
        super().__init__(gymnasium.make("CartPole-v1"))
        self.steps = 0

    def step(self, action: Any) -> Any:
        self.steps += 1
        if self.steps == 50:
            raise RuntimeError("boom: the simulator crashed")
        return super().step(action)


@pytest.mark.parametrize("arch", ["impala", "seed", "sample-factory"])
def test_a_dead_actor_ends_the_run_with_its_error_naming_it(arch: str) -> None:
    config = EnvRunConfig(
        env=_Boom, arch=arch, actors=2, envs_per_actor=2, target_return=None,
        time_budget_s=30.0, stall_timeout_s=20.0,
    )  # fmt: skip
    with pytest.raises(WorkerError, match=r"^actor-[01] failed: RuntimeError: boom") as e:
        train(config)
    assert e.value.worker in ("actor-0", "actor-1")
    assert "Traceback" in e.value.remote_traceback
