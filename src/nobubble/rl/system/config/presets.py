"""The source document's recipes as functions that return a run config:
``aggressive(RunConfig(...))``, ``nobubble rl train --preset conservative|aggressive``.

The numbers come from the algorithm toolbox's presets
(:func:`nobubble.rl.algo.presets.conservative`, :func:`~nobubble.rl.algo.presets.aggressive`);
this module says what each means for a running system:

- ``conservative``: lag <= 1 (0 in ``sync`` mode), GRPO with PPO clip 0.2, no replay
  (nothing outlives the weights it came from);
- ``aggressive``: lag <= 8, decoupled PPO - PPO's clip around the proximal policy, with
  the behaviour policy corrected by a truncated importance weight (V-trace's rho-bar
  truncation, the toolbox preset's ``use_vtrace``) - ``1 / (1 + lag)`` sample
  weights, and a prioritized replay of 4096 samples from which half a batch is drawn again
  each step.

Why decoupled PPO and not ``vtrace-ppo`` (V-trace advantages inside a clip around the
behaviour policy): at lag 8 most ratios to a policy 8 versions old fall outside the clip, so
their gradient is zero. Measured here (digits, trainer +0.3 s per step, seed 0): the preset
with ``vtrace-ppo`` stayed at 0.0 accuracy for 300 s; with decoupled PPO it reached 0.95 in
134 s.

A preset sets every lag-control setting it has (algorithm, staleness bound, replay, the
trainer's clip, staleness weights and KL) and keeps the rest of the config; a setting of
your own wins when it is laid over the preset's result (``dataclasses.replace``), the way
the command line applies its flags after ``--preset``.

:func:`ablation` is ``rl compare --ablation``'s grid: each lag fix alone, then all of them
(the aggressive preset), as configs at one staleness bound.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from nobubble.rl.system.config.run import RunConfig

__all__ = ["PRESETS", "ablation", "aggressive", "conservative"]


def _preset(name: str, cfg: RunConfig) -> RunConfig:
    """``cfg`` with the toolbox preset ``name``'s settings (it imports torch)."""
    from nobubble.rl.algo.presets import get_preset

    p = get_preset(name)
    run: dict[str, Any] = {"algo": "decoupled-ppo" if p.use_vtrace else "grpo"}
    if cfg.mode == "sync":
        if p.max_staleness > 1:
            raise ValueError(
                f"preset {name!r} trains at lag {p.max_staleness}; use --mode fully-async or "
                "one-step-off with it"
            )
    else:
        run["max_staleness"] = p.max_staleness
    if p.replay_capacity:
        run["replay"] = "prioritized" if p.prioritized_replay else "uniform"
        run["replay_capacity"] = max(1, p.replay_capacity // cfg.group_size)
        run["replay_groups"] = max(1, cfg.batch_groups // 2)
    else:
        run.update(replay="none", replay_capacity=0, replay_groups=0)
    trainer = replace(cfg.trainer, clip=p.clip_high, staleness_weighting=p.staleness_weighting,
                      kl_coef=p.kl_coef or cfg.trainer.kl_coef)  # fmt: skip
    return replace(cfg, trainer=trainer, **run)


def conservative(cfg: RunConfig) -> RunConfig:
    """Accuracy first: ``cfg`` at lag <= 1 (0 in sync mode), GRPO with clip 0.2, no replay."""
    return _preset("conservative", cfg)


def aggressive(cfg: RunConfig) -> RunConfig:
    """Throughput first: ``cfg`` at lag <= 8, decoupled PPO, ``1 / (1 + lag)`` weights and a
    prioritized replay of 4096 samples (refused in sync mode)."""
    return _preset("aggressive", cfg)


PRESETS: dict[str, Callable[[RunConfig], RunConfig]] = {
    "conservative": conservative,
    "aggressive": aggressive,
}


def ablation(base: RunConfig, max_staleness: int, trainer_delay_s: float) -> dict[str, RunConfig]:
    """Fix name -> ``base`` run fully-async at ``max_staleness``, one group per generation
    call, the trainer slowed by ``trainer_delay_s`` per step, with that lag fix on: each
    fix alone, then all of them (the aggressive preset at the same bound)."""
    t = replace(base.trainer, delay_s=trainer_delay_s)
    naive = replace(base, mode="fully-async", max_staleness=max_staleness,
                    groups_per_rollout=1, trainer=t)  # fmt: skip
    uniform = replace(naive, replay="uniform", replay_capacity=64, replay_groups=4)
    return {
        "naive PPO": naive,
        "drop>K": replace(naive, drop_staleness=max(1, max_staleness // 4)),
        "age weights": replace(naive, trainer=replace(t, staleness_weighting="inverse")),
        "KL to ref": replace(naive, trainer=replace(t, kl_coef=0.1, kl_refresh_every=20)),
        "replay uniform": uniform,
        "replay prioritized": replace(uniform, replay="prioritized"),
        "decoupled PPO": replace(naive, algo="decoupled-ppo"),
        "V-trace": replace(naive, algo="vtrace"),
        "all (aggressive)": replace(aggressive(naive), max_staleness=max_staleness),
    }
