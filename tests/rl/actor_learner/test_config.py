"""Bad configuration values are refused with a ValueError naming the value and the fix."""

from __future__ import annotations

import pytest

from nobubble.rl.actor_learner.config import EnvRunConfig, trajectories_per_update


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"arch": "a3c"}, r"EnvRunConfig.arch='a3c' is unknown; choose one of impala"),
        ({"actors": 0}, r"actors=0 must be an integer >= 1"),
        ({"envs_per_actor": 0}, r"envs_per_actor=0 must be"),
        ({"arch": "sample-factory", "envs_per_actor": 3}, r"envs_per_actor=3.*two groups"),
        ({"minibatches": 99}, r"minibatches=99 must be in \[1, 16\]"),
        ({"max_staleness": -1}, r"max_staleness=-1 must be an integer >= 0"),
        ({"env_step_delay_ms": -1.0}, r"env_step_delay_ms=-1.0 must be >= 0"),
        ({"gamma": 1.5}, r"gamma=1.5 must be in \[0, 1\]"),
        ({"loss": "a2c"}, r"loss='a2c' is unknown; choose one of ppo, vtrace"),
        ({"lr": 0.0}, r"EnvRunConfig.lr=0.0 must be > 0"),
        ({"stall_timeout_s": 0.0}, r"stall_timeout_s=0.0 must be > 0"),
        # a time budget of inf (or 1e308, or NaN) is no budget: refused like 0
        ({"time_budget_s": float("inf")}, r"time_budget_s=inf must be > 0"),
        ({"time_budget_s": 1e308}, r"time_budget_s=1e\+308 must be > 0"),
        ({"entropy_coef": float("nan")}, r"entropy_coef=nan must be >= 0"),
        ({"env": ""}, r"env='': pass a gymnasium id"),
        ({"start_method": "thread"}, r"start_method='thread' is unknown; choose one of fork"),
    ],
)
def test_bad_values_are_refused_naming_value_and_fix(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        EnvRunConfig(**kwargs)


def test_an_update_takes_the_same_env_columns_in_every_architecture() -> None:
    # sample-factory's trajectories are half a worker's envs, so it takes twice as many
    seed = EnvRunConfig(arch="seed", envs_per_actor=8, batch_trajectories=2)
    factory = EnvRunConfig(arch="sample-factory", envs_per_actor=8, batch_trajectories=2)
    assert trajectories_per_update(seed) * 8 == trajectories_per_update(factory) * 4 == 16


def test_unknown_env_id_is_refused_before_any_process_starts() -> None:
    import gymnasium

    from nobubble.rl.actor_learner.model import env_spaces

    with pytest.raises(gymnasium.error.Error):
        env_spaces("NoSuchEnv-v0")
    with pytest.raises(ValueError, match=r"action space .*Discrete"):
        env_spaces("Pendulum-v1")


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("seed", -1, r"seed=-1 must be an integer >= 0"),
        ("steps", 0, r"steps=0 must be an integer >= 1"),
        ("time_budget_s", float("inf"), r"time_budget_s=inf must be > 0"),
        ("max_staleness", -1, r"max_staleness=-1 must be an integer >= 0"),
        ("threads", 0, r"threads=0 must be an integer >= 1"),
        ("stall_timeout_s", float("nan"), r"stall_timeout_s=nan must be > 0"),
    ],
)
def test_the_settings_both_producers_have_are_checked_alike(name, value, message) -> None:
    from nobubble.rl.system.config import RunConfig

    for config in (RunConfig, EnvRunConfig):
        with pytest.raises(ValueError, match=rf"{config.__name__}\.{message}"):
            config(**{name: value})


def test_none_is_a_shared_setting_only_where_its_producer_defaults_to_none() -> None:
    from nobubble.rl.system.config import RunConfig

    assert EnvRunConfig(steps=None).steps is None  # no bound but the others
    assert RunConfig(time_budget_s=None).time_budget_s is None  # no limit
    with pytest.raises(ValueError, match=r"RunConfig.steps=None: .* default 400"):
        RunConfig(steps=None)
    with pytest.raises(ValueError, match=r"EnvRunConfig.time_budget_s=None: .* default 300"):
        EnvRunConfig(time_budget_s=None)


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("lr", 0.0, r"lr=0.0 must be > 0"),
        ("clip", 1.0, r"clip=1.0 must be in \(0, 1\)"),
        ("clip", float("nan"), r"clip=nan must be in \(0, 1\)"),
        ("entropy_coef", -0.1, r"entropy_coef=-0.1 must be >= 0"),
        ("value_coef", float("inf"), r"value_coef=inf must be >= 0"),
        ("max_grad_norm", 0.0, r"max_grad_norm=0.0 must be > 0"),
    ],
)
def test_the_learner_settings_both_producers_have_are_one_type_checked_alike(
    name, value, message
) -> None:
    """A task run's trainer and an environment run read one LearnerConfig's fields."""
    from nobubble.rl.system.config import LearnerConfig, TrainerConfig

    for config in (TrainerConfig, EnvRunConfig):
        assert issubclass(config, LearnerConfig)
        with pytest.raises(ValueError, match=rf"{config.__name__}\.{message}"):
            config(**{name: value})
    assert (EnvRunConfig().lr, EnvRunConfig().max_grad_norm) == (2.5e-3, 0.5)  # its defaults
