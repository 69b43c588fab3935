"""The conservative and aggressive presets say what the recipes say, and configs validate."""

from __future__ import annotations

import dataclasses

import pytest

from nobubble.rl.algo import RLAlgorithmConfig, aggressive, conservative, get_preset


def test_conservative_matches_the_seed() -> None:
    c = conservative()
    assert c.max_staleness <= 1
    assert 0.1 <= c.clip_low <= 0.2 and 0.1 <= c.clip_high <= 0.2
    assert c.clear_buffer_on_sync and c.replay_capacity == 0
    assert not c.use_vtrace and c.staleness_weighting == "none"


def test_aggressive_matches_the_seed() -> None:
    a = aggressive()
    assert 4 <= a.max_staleness <= 8
    assert a.use_vtrace and 0 < a.clip_low < 1 and a.clip_high > 0  # V-trace + PPO clip
    assert a.staleness_weighting == "inverse"
    assert a.prioritized_replay and a.replay_capacity >= 1024 and not a.clear_buffer_on_sync


def test_frozen_keyword_only_and_overrides_validated() -> None:
    c = conservative()
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.max_staleness = 3  # type: ignore[misc]
    with pytest.raises(TypeError):
        RLAlgorithmConfig("positional")  # type: ignore[misc]
    assert conservative(clip_low=0.1, clip_high=0.1).clip_low == 0.1
    assert get_preset("aggressive", max_staleness=4).max_staleness == 4
    assert aggressive().to_dict()["name"] == "aggressive"


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"max_staleness": -1}, "max_staleness=-1"),
        ({"clip_low": 1.0}, "clip_low=1.0"),
        ({"kl_coef": -0.1}, "kl_coef=-0.1"),
        ({"replay_alpha": 2.0}, "replay_alpha=2.0"),
        ({"prioritized_replay": True}, "needs replay_capacity > 0"),
        ({"staleness_weighting": "linear"}, "staleness_weighting='linear'"),
        ({"lag": 2}, r"unknown setting\(s\) \['lag'\]"),
        ({"replay_capacity": 1.5}, "replay_capacity=1.5"),
    ],
)
def test_bad_values_name_themselves(overrides, message) -> None:
    with pytest.raises(ValueError, match=message):
        conservative(**overrides)


def test_unknown_preset() -> None:
    with pytest.raises(ValueError, match="unknown preset 'fast'"):
        get_preset("fast")
