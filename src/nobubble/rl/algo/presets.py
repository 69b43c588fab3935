"""The two common recipes for asynchronous RL (conservative, aggressive) as validated, frozen config dataclasses.

    conservative (accuracy first): policy lag <= 1, PPO clip 0.1-0.2, buffer cleared at each
                                   weight sync.
    aggressive (throughput first): policy lag <= 4-8, V-trace + PPO clip, staleness
                                   weighting, large (prioritized) replay buffer.

:class:`RLAlgorithmConfig` is what the orchestrator reads; :func:`conservative` and
:func:`aggressive` return filled-in instances and accept keyword overrides, which are
validated like any other value.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Literal

from nobubble.rl.algo.aggregation import AggregationMode
from nobubble.rl.algo.losses import LOSS_AGG_MODES, LossAgg
from nobubble.rl.algo.staleness import StalenessKind
from nobubble.validation import check_fields

__all__ = ["RLAlgorithmConfig", "conservative", "aggressive", "get_preset", "PRESET_NAMES"]

PRESET_NAMES = ("conservative", "aggressive")
_AGGREGATIONS = ("sync-mean", "async", "local-sgd", "staleness-weighted")


@dataclass(frozen=True, kw_only=True)
class RLAlgorithmConfig:
    """Algorithmic knobs of an (a)synchronous RL run."""

    name: str = "custom"
    """Label shown in tables and logs."""
    max_staleness: int = 1
    """Largest policy lag K (learner version - sample version) kept; older samples dropped."""
    sync_every: int = 1
    """Publish weights to the rollout workers every N learner steps."""
    clip_low: float = 0.2
    """PPO ratio lower clip: ratio >= 1 - clip_low."""
    clip_high: float = 0.2
    """PPO ratio upper clip: ratio <= 1 + clip_high."""
    dual_clip: float | None = None
    """Dual-clip constant c > 1 for negative advantages; None = off."""
    loss_agg: LossAgg = "token-mean"
    """Loss aggregation mode (see ``aggregate_loss``)."""
    use_vtrace: bool = False
    """Compute V-trace targets/advantages for value-based runs."""
    vtrace_clip_rho: float = 1.0
    """V-trace rho-bar (value target truncation)."""
    vtrace_clip_pg_rho: float = 1.0
    """V-trace rho-bar for the policy-gradient advantage."""
    vtrace_lambda: float = 1.0
    """V-trace lambda (rlax); 1 = the paper's V-trace."""
    is_correction: Literal["none", "truncate", "mask"] = "none"
    """Behaviour-policy correction: truncated IS weights, band masking, or none."""
    is_level: Literal["token", "sequence", "geometric"] = "token"
    """Ratio level for the correction: token, sequence or geometric mean."""
    is_cap: float = 2.0
    """Truncation cap for IS weights (also the band's upper edge for "mask")."""
    staleness_weighting: StalenessKind = "none"
    """Per-sample/gradient weight by lag: "inverse" = 1 / (1 + lag), "exp", or "none"."""
    kl_coef: float = 0.0
    """Coefficient of the KL(pi || pi_ref) penalty; 0 = off."""
    kl_kind: Literal["k1", "k2", "k3"] = "k3"
    """KL estimator."""
    clear_buffer_on_sync: bool = True
    """Drop all buffered experience whenever new weights are published."""
    replay_capacity: int = 0
    """Replay buffer size in samples; 0 = no replay (train on each sample once)."""
    prioritized_replay: bool = False
    """Sample replay proportional to priority^alpha (needs replay_capacity > 0)."""
    replay_alpha: float = 0.6
    """Priority exponent alpha in [0, 1]."""
    replay_beta: float = 0.4
    """IS-correction exponent beta in [0, 1]."""
    aggregation: AggregationMode = "sync-mean"
    """How learner workers combine gradients."""
    local_sgd_steps: int = 1
    """H, local steps between parameter averages (aggregation="local-sgd")."""
    group_version_check: bool = True
    """Require every GRPO group to come from a single policy version."""

    def __post_init__(self) -> None:
        _check_int(self.max_staleness, "max_staleness", 0, "0 = on-policy")
        _check_int(self.sync_every, "sync_every", 1, "1 = every step")
        _check_int(self.replay_capacity, "replay_capacity", 0, "0 = no replay")
        _check_int(self.local_sgd_steps, "local_sgd_steps", 1, "1 = synchronous")
        if not 0.0 <= self.clip_low < 1.0:
            raise ValueError(f"RLAlgorithmConfig: clip_low={self.clip_low} must be in [0, 1)")
        if self.clip_high < 0.0:
            raise ValueError(f"RLAlgorithmConfig: clip_high={self.clip_high} must be >= 0")
        if self.dual_clip is not None and self.dual_clip <= 1.0:
            raise ValueError(f"RLAlgorithmConfig: dual_clip={self.dual_clip} must be > 1 or None")
        _check_choice(self.loss_agg, "loss_agg", LOSS_AGG_MODES)
        _check_choice(self.is_correction, "is_correction", ("none", "truncate", "mask"))
        _check_choice(self.is_level, "is_level", ("token", "sequence", "geometric"))
        _check_choice(self.staleness_weighting, "staleness_weighting", ("inverse", "exp", "none"))
        _check_choice(self.kl_kind, "kl_kind", ("k1", "k2", "k3"))
        _check_choice(self.aggregation, "aggregation", _AGGREGATIONS)
        names = ("vtrace_clip_rho", "vtrace_clip_pg_rho", "is_cap")
        check_fields("RLAlgorithmConfig", self, names, "> 0")
        if self.is_correction == "mask" and self.is_cap <= 1.0:
            raise ValueError(
                f"RLAlgorithmConfig: is_cap={self.is_cap} is the band's upper edge for "
                "is_correction='mask' and must be > 1"
            )
        for name in ("vtrace_lambda", "replay_alpha", "replay_beta"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(
                    f"RLAlgorithmConfig: {name}={getattr(self, name)} must be in [0, 1]"
                )
        if self.kl_coef < 0:
            raise ValueError(f"RLAlgorithmConfig: kl_coef={self.kl_coef} must be >= 0")
        if self.prioritized_replay and self.replay_capacity == 0:
            raise ValueError(
                "RLAlgorithmConfig: prioritized_replay=True needs replay_capacity > 0 "
                "(set replay_capacity, e.g. 4096, or prioritized_replay=False)"
            )
        if self.local_sgd_steps > 1 and self.aggregation != "local-sgd":
            raise ValueError(
                f"RLAlgorithmConfig: local_sgd_steps={self.local_sgd_steps} only applies to "
                f"aggregation='local-sgd' (got aggregation={self.aggregation!r})"
            )

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _check_int(value: Any, name: str, minimum: int, hint: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(
            f"RLAlgorithmConfig: {name}={value!r} must be an int >= {minimum} ({hint})"
        )


def _check_choice(value: Any, name: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ValueError(f"RLAlgorithmConfig: {name}={value!r}; use one of {choices}")


def _replace(base: RLAlgorithmConfig, overrides: dict[str, Any]) -> RLAlgorithmConfig:
    known = {f.name for f in dataclasses.fields(RLAlgorithmConfig)}
    unknown = sorted(set(overrides) - known)
    if unknown:
        raise ValueError(f"{base.name}(): unknown setting(s) {unknown}; valid: {sorted(known)}")
    return dataclasses.replace(base, **overrides)


def conservative(**overrides: Any) -> RLAlgorithmConfig:
    """Accuracy first: lag <= 1, PPO clip 0.2, buffer cleared at each sync, no replay."""
    base = RLAlgorithmConfig(
        name="conservative",
        max_staleness=1,
        sync_every=1,
        clip_low=0.2,
        clip_high=0.2,
        use_vtrace=False,
        is_correction="none",
        staleness_weighting="none",
        clear_buffer_on_sync=True,
        replay_capacity=0,
        prioritized_replay=False,
        aggregation="sync-mean",
    )
    return _replace(base, overrides)


def aggressive(**overrides: Any) -> RLAlgorithmConfig:
    """Throughput first: lag <= 8, V-trace + PPO clip (dual clip 3), truncated IS,
    1 / (1 + lag) staleness weights, 4096-sample prioritized replay."""
    base = RLAlgorithmConfig(
        name="aggressive",
        max_staleness=8,
        sync_every=1,
        clip_low=0.2,
        clip_high=0.2,
        dual_clip=3.0,
        use_vtrace=True,
        vtrace_clip_rho=1.0,
        vtrace_clip_pg_rho=1.0,
        is_correction="truncate",
        is_level="token",
        is_cap=2.0,
        staleness_weighting="inverse",
        clear_buffer_on_sync=False,
        replay_capacity=4096,
        prioritized_replay=True,
        replay_alpha=0.6,
        replay_beta=0.4,
        aggregation="staleness-weighted",
    )
    return _replace(base, overrides)


def get_preset(name: str, **overrides: Any) -> RLAlgorithmConfig:
    """The preset called ``name`` (``"conservative"`` or ``"aggressive"``) with overrides."""
    if name == "conservative":
        return conservative(**overrides)
    if name == "aggressive":
        return aggressive(**overrides)
    raise ValueError(f"get_preset: unknown preset {name!r}; use one of {PRESET_NAMES}")
