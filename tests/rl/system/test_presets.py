"""The presets are functions that return a run config, and each says what its recipe says.

The references are the source document's published ranges (conservative: policy lag <= 1,
PPO clip 0.1-0.2, nothing kept across weight syncs; aggressive: lag 4-8, V-trace's
correction with PPO's clip, staleness weighting, a large prioritized replay) and the values
the docs state (clip 0.2, lag 8, 4096 samples, half a batch drawn again), written here
independently of the preset functions.
"""

from __future__ import annotations

from dataclasses import fields, replace

import pytest

from nobubble.rl.system.config import MODES, ReplayConfig, RunConfig, TrainerConfig
from nobubble.rl.system.config.presets import PRESETS, ablation, aggressive, conservative

TINY = dict(batch_groups=2, group_size=4, eval_every=5, policy_kwargs={"hidden": 16}, timeout_s=240)
# what a preset may set; every other field of the config it is given is kept
LAG_CONTROLS = {"algo", "max_staleness", "replay", "trainer"}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("sizes", [{}, TINY])
def test_conservative_matches_the_seed(mode, sizes) -> None:
    c = conservative(RunConfig(mode=mode, **sizes))
    assert c.effective_max_staleness == (0 if mode == "sync" else 1)
    assert 0.1 <= c.trainer.clip <= 0.2 and c.trainer.clip == 0.2
    assert c.algo == "grpo"  # no behaviour correction: nothing to correct at lag <= 1
    assert c.trainer.staleness_weighting == "none" and c.trainer.kl_coef == 0.0
    # nothing outlives the weights it came from
    assert (c.replay.mode, c.replay.capacity, c.replay.groups_per_step) == ("none", 0, 0)


@pytest.mark.parametrize("mode", ["one-step-off", "fully-async"])
@pytest.mark.parametrize(("group_size", "batch_groups"), [(32, 8), (4, 2), (3, 5), (5000, 1)])
def test_aggressive_matches_the_seed(mode, group_size, batch_groups) -> None:
    a = aggressive(RunConfig(mode=mode, group_size=group_size, batch_groups=batch_groups))
    assert 4 <= a.effective_max_staleness <= 8 and a.effective_max_staleness == 8
    # decoupled PPO: PPO's clip around pi_prox times V-trace's truncated IS on pi_behav
    assert a.algo == "decoupled-ppo" and 0 < a.trainer.clip < 1 and a.trainer.clip == 0.2
    assert a.trainer.staleness_weighting == "inverse" and a.trainer.kl_coef == 0.0
    assert a.replay.mode == "prioritized"
    # 4096 samples, a large buffer (>= 1024), kept as whole groups, at least one
    kept = group_size * a.replay.capacity
    if group_size <= 4096:
        assert 4096 - group_size < kept <= 4096 and kept >= 1024
    else:
        assert a.replay.capacity == 1
    # half a batch drawn again per step, at least one group
    assert a.replay.groups_per_step == max(1, batch_groups // 2)


def test_aggressive_refuses_sync_mode() -> None:
    with pytest.raises(ValueError, match="preset 'aggressive' trains at lag 8"):
        aggressive(RunConfig(mode="sync"))


@pytest.mark.parametrize("name", ["conservative", "aggressive"])
def test_a_preset_keeps_the_rest_of_the_config(name) -> None:
    trainer = TrainerConfig(lr=0.01, delay_s=0.3, kl_coef=0.1, kl_refresh_every=5)
    base = RunConfig(mode="fully-async", steps=7, seed=3, sync_every=2, trainer=trainer, **TINY)
    cfg = PRESETS[name](base)
    for f in fields(RunConfig):
        if f.name not in LAG_CONTROLS:
            assert getattr(cfg, f.name) == getattr(base, f.name), f.name
    # the trainer's own settings too; a recipe without a KL penalty keeps the config's
    kept = ("lr", "delay_s", "kl_coef", "kl_refresh_every", "uniform_kl_coef", "max_grad_norm")
    assert all(getattr(cfg.trainer, k) == getattr(trainer, k) for k in kept)


def test_a_preset_returns_its_config_and_settings_laid_over_it_win():
    base = RunConfig(mode="fully-async", **TINY)
    cfg = aggressive(base)
    assert cfg.algo == "decoupled-ppo" and cfg.effective_max_staleness == 8
    assert cfg.replay.mode == "prioritized" and cfg.replay.capacity == 4096 // 4
    assert cfg.replay.groups_per_step == 1  # half of batch_groups=2
    assert cfg.trainer.staleness_weighting == "inverse" and cfg.trainer.clip == 0.2
    assert replace(cfg, algo="decoupled-ppo") == cfg and base.algo == "grpo"  # base untouched
    assert aggressive(cfg) == cfg and conservative(conservative(base)) == conservative(base)
    mine = replace(
        cfg, max_staleness=4, algo="grpo", replay=ReplayConfig(),
        trainer=replace(cfg.trainer, clip=0.1),
    )  # fmt: skip
    assert (mine.algo, mine.effective_max_staleness, mine.replay.mode) == ("grpo", 4, "none")
    assert mine.trainer.clip == 0.1 and mine.trainer.staleness_weighting == "inverse"
    with pytest.raises(TypeError, match="preset"):
        RunConfig(preset="aggressive")  # type: ignore[call-arg]  # a preset is a function


@pytest.mark.parametrize(
    ("override", "message"),
    [
        (lambda c: replace(c, max_staleness=-1), "max_staleness=-1"),
        (lambda c: replace(c.replay, alpha=2.0), "ReplayConfig.alpha=2.0"),
        (lambda c: replace(c.replay, capacity=0), "needs capacity >= 1"),
        (lambda c: replace(c, algo="impala"), "algo='impala'"),
        (lambda c: replace(c.trainer, clip=-0.1), "clip=-0.1"),
        (lambda c: replace(c.trainer, staleness_weighting="linear"), "'linear'"),
    ],
)
def test_a_bad_setting_laid_over_a_preset_names_itself(override, message) -> None:
    with pytest.raises(ValueError, match=message):
        override(aggressive(RunConfig(mode="fully-async", **TINY)))


def test_ablation_configs_are_valid():
    grid = ablation(RunConfig(**TINY), 8, 0.3)
    assert grid["drop>K"].drop_staleness == 2 and len(grid) == 9
    assert all(c.mode == "fully-async" and c.effective_max_staleness == 8 for c in grid.values())
    assert all(c.trainer.delay_s == 0.3 for c in grid.values())
    assert grid["all (aggressive)"].algo == "decoupled-ppo"
    assert grid["all (aggressive)"].trainer.staleness_weighting == "inverse"


def test_a_comparison_expands_one_config_into_its_runs():
    """``rl compare``'s runs: the modes of a task run, the architectures of an env run, or the
    ablation's fixes at each bound, labelled ``eta<K>:<fix>``, all on one budget."""
    from nobubble.rl import comparison
    from nobubble.rl.actor_learner.config import EnvRunConfig

    task = RunConfig(steps=7, **TINY)
    modes = comparison(task)
    assert list(modes) == list(MODES) and all(c.mode == m for m, c in modes.items())
    assert {c.steps for c in modes.values()} == {7}
    archs = comparison(EnvRunConfig(time_budget_s=30.0))
    assert list(archs) == ["impala", "seed", "sample-factory"]
    assert all(c.arch == a and c.time_budget_s == 30.0 for a, c in archs.items())
    grid = comparison(task, ablation=(2, 4))
    assert len(grid) == 18 and grid["eta4:drop>K"].drop_staleness == 1
    assert {c.trainer.delay_s for c in grid.values()} == {0.3}  # the default slowdown
    slow = comparison(replace(task, trainer=TrainerConfig(delay_s=0.1)), ablation=(2,))
    assert {c.trainer.delay_s for c in slow.values()} == {0.1}
    with pytest.raises(ValueError, match="ablation is of task runs"):
        comparison(EnvRunConfig(), ablation=(8,))
    with pytest.raises(ValueError, match=r"ablation=\[0\]: give staleness bounds >= 1"):
        comparison(task, ablation=(0,))
    with pytest.raises(TypeError, match="pass a RunConfig"):
        comparison(object())  # type: ignore[arg-type]
