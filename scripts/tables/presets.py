"""The RL presets table of docs/rl/algorithms.md, read from the code that defines the presets
(:mod:`nobubble.rl.system.config.presets`), not from a benchmark: each preset applied to the
default ``RunConfig`` in the mode it is meant for, and the settings it returned."""

from __future__ import annotations

from typing import Any

from benchmarks.records import Renderer, md_table

ALGO = {
    "grpo": "GRPO (no behaviour correction)",
    "decoupled-ppo": "decoupled PPO (V-trace's truncated IS on pi_prox / pi_behav)",
}
WEIGHTING = {"none": "none", "inverse": "1 / (1 + lag)", "exp": "0.5 ** lag"}


def _setting(cfg: Any) -> dict[str, str]:
    """One preset's settings, worded as on the page."""
    if not cfg.replay.on:
        replay, draw = "none", "-"
    else:
        replay = (
            f"{cfg.replay.capacity * cfg.group_size} samples ({cfg.replay.capacity} groups of "
            f"{cfg.group_size}), {cfg.replay.mode} (alpha {cfg.replay.alpha:g}, "
            f"beta {cfg.replay.beta:g})"
        )
        draw = f"{cfg.replay.groups_per_step} of {cfg.batch_groups} groups"
    return {
        "`max_staleness` (policy lag K)": str(cfg.effective_max_staleness),
        "`algo`": ALGO.get(cfg.algo, cfg.algo),
        "PPO clip": f"{cfg.trainer.clip:g}",
        "staleness weighting": WEIGHTING[cfg.trainer.staleness_weighting],
        "KL to a reference": f"{cfg.trainer.kl_coef:g}" if cfg.trainer.kl_coef else "none",
        "replay": replay,
        "drawn again per batch": draw,
    }


def presets() -> str:
    """The settings ``conservative(cfg)`` and ``aggressive(cfg)`` return for the default
    ``RunConfig`` (batch 8 groups of 32) in one-step-off and fully-async mode."""
    from nobubble.rl.system.config import RunConfig
    from nobubble.rl.system.config.presets import aggressive, conservative

    c = _setting(conservative(RunConfig(mode="one-step-off")))
    a = _setting(aggressive(RunConfig(mode="fully-async")))
    return md_table(
        ["setting", "`conservative(cfg)`", "`aggressive(cfg)`"],
        [[k, c[k], a[k]] for k in c],
        align="lll",
    )


TABLES: dict[str, Renderer] = {"rl.presets": presets}
