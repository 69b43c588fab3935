"""Each config field's declared check (``setting``) is run once, by ``Settings``, for every
kind of rule: a count, an interval, a set of values, a sub-config type."""

from __future__ import annotations

import pytest

from nobubble.rl.system.config import RewardConfig, RunConfig, TrainerConfig


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"drop_staleness": 1.5}, r"RunConfig.drop_staleness=1.5 must be an integer >= 0"),
        ({"target_accuracy": 0.0}, r"RunConfig.target_accuracy=0.0 must be in \(0, 1\]"),
        ({"target_accuracy": float("nan")}, r"target_accuracy=nan must be in \(0, 1\]"),
        ({"partial_rollouts": 1}, r"partial_rollouts=1 is unknown; choose one of False, True"),
        ({"restart_workers": "yes"}, r"restart_workers='yes' is unknown"),
        ({"resume": "always"}, r"resume='always' is unknown; choose one of False, True, or-start"),
        ({"trainer": {"delay_s": 0.1}}, r"RunConfig.trainer=\{'delay_s': 0.1\}: give a Trainer"),
        ({"batch_groups": None}, r"RunConfig.batch_groups=None: .* default 8"),
        ({"groups_per_rollout": 2.0}, r"groups_per_rollout=2.0 must be in 1..batch_groups"),
    ],
)
def test_each_kind_of_rule_refuses_naming_the_value(kwargs, message) -> None:
    with pytest.raises(ValueError, match=message):
        RunConfig(**kwargs)


def test_the_bounds_of_an_interval_are_open_or_closed_as_written(tmp_path) -> None:
    assert RunConfig(target_accuracy=1.0).target_accuracy == 1.0  # (0, 1]: 1 is in
    assert RewardConfig(failure_rate=0.0).failure_rate == 0.0  # [0, 1]: both ends in
    assert RewardConfig(failure_rate=1.0).failure_rate == 1.0
    for clip in (0.0, 1.0):  # (0, 1): neither end
        with pytest.raises(ValueError, match=rf"TrainerConfig.clip={clip} must be in \(0, 1\)"):
            TrainerConfig(clip=clip)
    assert RunConfig(resume="or-start", checkpoint_dir=str(tmp_path)).resume == "or-start"
