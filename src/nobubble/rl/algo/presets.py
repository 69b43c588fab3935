"""The two common recipes for asynchronous RL (conservative, aggressive) as validated, frozen config dataclasses.

    conservative (accuracy first): policy lag <= 1, PPO clip 0.1-0.2, buffer cleared at each
                                   weight sync.
    aggressive (throughput first): policy lag <= 4-8, V-trace + PPO clip, staleness
                                   weighting, large (prioritized) replay buffer.

:class:`RLAlgorithmConfig` holds exactly the recipe's settings, which the running system
turns into run settings (:mod:`nobubble.rl.system.config.presets`); :func:`conservative` and
:func:`aggressive` return filled-in instances and accept keyword overrides, which are
validated like any other value.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from nobubble.rl.algo.staleness import StalenessKind
from nobubble.validation import check_fields

__all__ = ["RLAlgorithmConfig", "conservative", "aggressive", "get_preset", "PRESET_NAMES"]

PRESET_NAMES = ("conservative", "aggressive")


@dataclass(frozen=True, kw_only=True)
class RLAlgorithmConfig:
    """Algorithmic knobs of an (a)synchronous RL run."""

    name: str = "custom"
    """Label shown in tables and logs."""
    max_staleness: int = 1
    """Largest policy lag K (learner version - sample version) kept; older samples dropped."""
    clip_low: float = 0.2
    """PPO ratio lower clip: ratio >= 1 - clip_low."""
    clip_high: float = 0.2
    """PPO ratio upper clip: ratio <= 1 + clip_high."""
    use_vtrace: bool = False
    """Correct for the behaviour policy with V-trace's truncated importance weight (the
    running system: decoupled PPO, whose pi_prox / pi_behav weight is truncated)."""
    staleness_weighting: StalenessKind = "none"
    """Per-sample weight by lag: "inverse" = 1 / (1 + lag), "exp", or "none"."""
    kl_coef: float = 0.0
    """Coefficient of the KL(pi || pi_ref) penalty; 0 = off."""
    clear_buffer_on_sync: bool = True
    """Nothing outlives the weights it came from (no replay across weight syncs)."""
    replay_capacity: int = 0
    """Replay buffer size in samples; 0 = no replay (train on each sample once)."""
    prioritized_replay: bool = False
    """Sample replay proportional to priority^alpha (needs replay_capacity > 0)."""
    replay_alpha: float = 0.6
    """Priority exponent alpha in [0, 1]."""
    replay_beta: float = 0.4
    """IS-correction exponent beta in [0, 1]."""

    def __post_init__(self) -> None:
        check_fields(
            "RLAlgorithmConfig", self, ("max_staleness", "replay_capacity"), ">= 0", integer=True
        )
        if not 0.0 <= self.clip_low < 1.0:
            raise ValueError(f"RLAlgorithmConfig: clip_low={self.clip_low} must be in [0, 1)")
        check_fields("RLAlgorithmConfig", self, ("clip_high", "kl_coef"), ">= 0")
        if self.staleness_weighting not in ("inverse", "exp", "none"):
            raise ValueError(
                f"RLAlgorithmConfig: staleness_weighting={self.staleness_weighting!r}; use one "
                "of ('inverse', 'exp', 'none')"
            )
        for name in ("replay_alpha", "replay_beta"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(
                    f"RLAlgorithmConfig: {name}={getattr(self, name)} must be in [0, 1]"
                )
        if self.prioritized_replay and self.replay_capacity == 0:
            raise ValueError(
                "RLAlgorithmConfig: prioritized_replay=True needs replay_capacity > 0 "
                "(set replay_capacity, e.g. 4096, or prioritized_replay=False)"
            )

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _replace(base: RLAlgorithmConfig, overrides: dict[str, Any]) -> RLAlgorithmConfig:
    known = {f.name for f in dataclasses.fields(RLAlgorithmConfig)}
    unknown = sorted(set(overrides) - known)
    if unknown:
        raise ValueError(f"{base.name}(): unknown setting(s) {unknown}; valid: {sorted(known)}")
    return dataclasses.replace(base, **overrides)


def conservative(**overrides: Any) -> RLAlgorithmConfig:
    """Accuracy first: lag <= 1, PPO clip 0.2, buffer cleared at each sync, no replay."""
    base = RLAlgorithmConfig(name="conservative", max_staleness=1, clear_buffer_on_sync=True)
    return _replace(base, overrides)


def aggressive(**overrides: Any) -> RLAlgorithmConfig:
    """Throughput first: lag <= 8, V-trace's truncated IS + PPO clip, 1 / (1 + lag)
    staleness weights, 4096-sample prioritized replay."""
    base = RLAlgorithmConfig(
        name="aggressive",
        max_staleness=8,
        use_vtrace=True,
        staleness_weighting="inverse",
        clear_buffer_on_sync=False,
        replay_capacity=4096,
        prioritized_replay=True,
    )
    return _replace(base, overrides)


def get_preset(name: str, **overrides: Any) -> RLAlgorithmConfig:
    """The preset called ``name`` (``"conservative"`` or ``"aggressive"``) with overrides."""
    if name == "conservative":
        return conservative(**overrides)
    if name == "aggressive":
        return aggressive(**overrides)
    raise ValueError(f"get_preset: unknown preset {name!r}; use one of {PRESET_NAMES}")
