"""The source document's recipes as functions that return a run config:
``aggressive(RunConfig(...))``, ``nobubble rl train --preset conservative|aggressive``.

Each recipe's numbers are stated once, in its function:

- ``conservative`` (accuracy first): lag <= 1 (0 in ``sync`` mode), GRPO with PPO clip 0.2,
  no replay (nothing outlives the weights it came from);
- ``aggressive`` (throughput first): lag <= 8, decoupled PPO - PPO's clip around the
  proximal policy, with the behaviour policy corrected by a truncated importance weight
  (V-trace's rho-bar truncation) - ``1 / (1 + lag)`` sample weights, and a prioritized
  replay of 4096 samples from which half a batch is drawn again each step.

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


def conservative(cfg: RunConfig) -> RunConfig:
    """Accuracy first: ``cfg`` at lag <= 1 (0 in sync mode), GRPO with clip 0.2, no replay."""
    return _lag_control(cfg, "conservative", max_staleness=1, algo="grpo", clip=0.2,
                        staleness_weighting="none", kl_coef=0.0, replay="none",
                        replay_samples=0, replay_draw=0.0)  # fmt: skip


def aggressive(cfg: RunConfig) -> RunConfig:
    """Throughput first: ``cfg`` at lag <= 8, decoupled PPO with clip 0.2, ``1 / (1 + lag)``
    weights and a prioritized replay of 4096 samples, half a batch drawn from it again per
    step (refused in sync mode)."""
    return _lag_control(cfg, "aggressive", max_staleness=8, algo="decoupled-ppo", clip=0.2,
                        staleness_weighting="inverse", kl_coef=0.0, replay="prioritized",
                        replay_samples=4096, replay_draw=0.5)  # fmt: skip


def _lag_control(
    cfg: RunConfig, name: str, *, max_staleness: int, algo: str, clip: float,
    staleness_weighting: str, kl_coef: float, replay: str, replay_samples: int,
    replay_draw: float,
) -> RunConfig:  # fmt: skip
    """``cfg`` with recipe ``name``'s lag controls. ``replay_samples``: the replay's size in
    samples (kept as whole groups of ``cfg.group_size``); ``replay_draw``: the fraction of a
    batch's groups drawn from it again per step; ``kl_coef`` 0 adds no KL penalty of the
    recipe's (the config's own is kept)."""
    run: dict[str, Any] = {"algo": algo}
    if cfg.mode != "sync":
        run["max_staleness"] = max_staleness
    elif max_staleness > 1:
        raise ValueError(
            f"preset {name!r} trains at lag {max_staleness}; use --mode fully-async or "
            "one-step-off with it"
        )
    if replay == "none":
        run.update(replay="none", replay_capacity=0, replay_groups=0)
    else:
        run.update(replay=replay, replay_capacity=max(1, replay_samples // cfg.group_size),
                   replay_groups=max(1, int(cfg.batch_groups * replay_draw)))  # fmt: skip
    trainer = replace(cfg.trainer, clip=clip, staleness_weighting=staleness_weighting,
                      kl_coef=kl_coef or cfg.trainer.kl_coef)  # fmt: skip
    return replace(cfg, trainer=trainer, **run)


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
