"""The RL presets table of docs/rl/algorithms.md, read from the code that defines the presets
(:mod:`nobubble.rl.algo.presets`), not from a benchmark."""

from __future__ import annotations

from typing import Any

from benchmarks.records import Renderer, md_table


def _setting(cfg: Any) -> dict[str, str]:
    """One preset's settings, worded as on the page."""
    weighting = {"none": "none", "inverse": "1 / (1 + lag)", "exp": "exp(-lag)"}
    if cfg.replay_capacity == 0:
        replay = "none"
    elif cfg.prioritized_replay:
        replay = (
            f"{cfg.replay_capacity} samples, prioritized "
            f"(alpha {cfg.replay_alpha:g}, beta {cfg.replay_beta:g})"
        )
    else:
        replay = f"{cfg.replay_capacity} samples, uniform"
    same = cfg.clip_low == cfg.clip_high
    clip = f"{cfg.clip_low:g}" if same else f"{cfg.clip_low:g}-{cfg.clip_high:g}"
    return {
        "`max_staleness` (policy lag K)": str(cfg.max_staleness),
        "PPO clip": clip,
        "behaviour correction": "V-trace's truncated IS" if cfg.use_vtrace else "none",
        "staleness weighting": weighting[cfg.staleness_weighting],
        "buffer at weight sync": "cleared" if cfg.clear_buffer_on_sync else "kept",
        "replay": replay,
    }


def presets() -> str:
    """The settings of ``conservative()`` and ``aggressive()``, read from the presets."""
    from nobubble.rl.algo import aggressive, conservative

    c, a = _setting(conservative()), _setting(aggressive())
    return md_table(
        ["setting", "`conservative()`", "`aggressive()`"],
        [[k, c[k], a[k]] for k in c],
        align="lll",
    )


TABLES: dict[str, Renderer] = {"rl.presets": presets}
