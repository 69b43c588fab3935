"""The source document's recipes, ``aggressive(RunConfig(...))`` (``rl train --preset``): a
preset sets its lag controls (algorithm, staleness bound, replay, the trainer's clip and
staleness weights) and keeps the rest; a setting laid over its result wins. :func:`ablation`
is ``rl compare --ablation``'s grid.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from nobubble.rl.system.config import ReplayConfig, RunConfig

__all__ = ["PRESETS", "ablation", "aggressive", "conservative"]


def conservative(cfg: RunConfig) -> RunConfig:
    """Accuracy first: ``cfg`` at lag <= 1 (0 in sync mode), GRPO with clip 0.2, no replay
    (nothing outlives the weights it came from)."""
    return _lag_control(cfg, "conservative", 1, "grpo", clip=0.2, weighting="none")


def aggressive(cfg: RunConfig) -> RunConfig:
    """Throughput first: ``cfg`` at lag <= 8, decoupled PPO with clip 0.2, ``1 / (1 + lag)``
    weights and a prioritized replay of 4096 samples, half a batch drawn from it again per
    step (refused in sync mode)."""
    return _lag_control(cfg, "aggressive", 8, "decoupled-ppo", clip=0.2, weighting="inverse",
                        replay=("prioritized", 4096, 0.5))  # fmt: skip


def _lag_control(
    cfg: RunConfig, name: str, max_staleness: int, algo: str, *, clip: float, weighting: str,
    replay: tuple[str, int, float] = ("none", 0, 0.0),
) -> RunConfig:  # fmt: skip
    """``cfg`` with recipe ``name``'s lag controls. ``replay``: ``(mode, samples, draw)``, the
    replay's size in samples (kept as whole groups of ``cfg.group_size``, at least one) and
    the fraction of a batch's groups drawn from it again per step (at least one)."""
    if cfg.mode == "sync" and max_staleness > 1:
        raise ValueError(
            f"preset {name!r} trains at lag {max_staleness}; use --mode fully-async or "
            "one-step-off with it"
        )
    mode, samples, draw = replay
    capacity = max(1, samples // cfg.group_size) if samples else 0
    groups = max(1, int(cfg.batch_groups * draw)) if samples else 0
    lag = cfg.max_staleness if cfg.mode == "sync" else max_staleness
    trainer = replace(cfg.trainer, clip=clip, staleness_weighting=weighting)
    replay_cfg = ReplayConfig(mode=mode, capacity=capacity, groups_per_step=groups)
    return replace(cfg, algo=algo, max_staleness=lag, replay=replay_cfg, trainer=trainer)


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
    uniform = replace(naive, replay=ReplayConfig(mode="uniform", capacity=64, groups_per_step=4))
    return {
        "naive PPO": naive,
        "drop>K": replace(naive, drop_staleness=max(1, max_staleness // 4)),
        "age weights": replace(naive, trainer=replace(t, staleness_weighting="inverse")),
        "KL to ref": replace(naive, trainer=replace(t, kl_coef=0.1, kl_refresh_every=20)),
        "replay uniform": uniform,
        "replay prioritized": replace(uniform, replay=replace(uniform.replay, mode="prioritized")),
        "decoupled PPO": replace(naive, algo="decoupled-ppo"),
        "V-trace": replace(naive, algo="vtrace"),
        "all (aggressive)": replace(aggressive(naive), max_staleness=max_staleness),
    }
