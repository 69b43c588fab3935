"""The source document's recipes as run settings: ``--preset conservative|aggressive``.

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

:func:`resolve_preset` fills only the settings a run left unset (None); anything given
explicitly wins. The run's JSON records the resolved values.

:func:`ablation` is ``rl compare --ablation``'s grid: each lag fix alone, then all of them
(the aggressive preset), as :class:`RunConfig` settings at one staleness bound.
"""

from __future__ import annotations

from typing import Any

__all__ = ["ALGOS", "ablation", "resolve_preset"]

# the policy-gradient algorithms a run may name (the trainer implements each)
ALGOS = ("grpo", "ppo", "decoupled-ppo", "vtrace", "vtrace-ppo")

# the settings a preset may fill, and their value when neither the run nor a preset sets them
DEFAULTS: dict[str, Any] = {
    "algo": "grpo",
    "replay": "none",
    "replay_capacity": 0,
    "replay_groups": 0,
}


def _preset_values(
    name: str, mode: str, group_size: int, batch_groups: int
) -> tuple[dict[str, Any], dict[str, Any]]:
    """(run settings, trainer settings) of the preset ``name``."""
    from nobubble.rl.algo.presets import get_preset

    p = get_preset(name)
    trainer: dict[str, Any] = {"clip": p.clip_high, "staleness_weighting": p.staleness_weighting}
    if p.kl_coef:
        trainer["kl_coef"] = p.kl_coef
    run: dict[str, Any] = {"algo": "decoupled-ppo" if p.use_vtrace else "grpo"}
    if mode == "sync":
        if p.max_staleness > 1:
            raise ValueError(
                f"preset {name!r} trains at lag {p.max_staleness}; use --mode fully-async or "
                "one-step-off with it"
            )
    else:
        run["max_staleness"] = p.max_staleness
    if p.replay_capacity:
        run["replay"] = "prioritized" if p.prioritized_replay else "uniform"
        run["replay_capacity"] = max(1, p.replay_capacity // group_size)
        run["replay_groups"] = max(1, batch_groups // 2)
    else:
        run["replay"] = "none"
    return run, trainer


def resolve_preset(
    preset: str | None,
    *,
    mode: str,
    group_size: int,
    batch_groups: int,
    given: dict[str, Any],
    trainer: dict[str, Any],
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The run settings ``given`` (None = unset) completed by ``preset`` and the defaults,
    and the trainer settings ``trainer`` laid over the preset's. Without a preset it loads no
    torch (the toolbox :mod:`nobubble.rl.algo` does), so a run's flags are checked first."""
    run_over: dict[str, Any] = {}
    trainer_base: dict[str, Any] = {}
    if preset is not None:
        from nobubble.rl.algo.presets import PRESET_NAMES

        if preset not in PRESET_NAMES:
            raise ValueError(f"preset={preset!r} is unknown; choose {', '.join(PRESET_NAMES)}")
        run_over, trainer_base = _preset_values(preset, mode, group_size, batch_groups)
    out = {}
    for name, value in given.items():
        if value is not None:
            out[name] = value
        elif name in run_over:
            out[name] = run_over[name]
        else:
            out[name] = DEFAULTS.get(name)
    return out, {**trainer_base, **trainer}


# each lag fix alone, then all of them; "quarter": a quarter of the staleness bound
_ABLATION: dict[str, dict[str, Any]] = {
    "naive PPO": {},
    "drop>K": {"drop_staleness": "quarter"},
    "age weights": {"trainer": {"staleness_weighting": "inverse"}},
    "KL to ref": {"trainer": {"kl_coef": 0.1, "kl_refresh_every": 20}},
    "replay uniform": {"replay": "uniform", "replay_capacity": 64, "replay_groups": 4},
    "replay prioritized": {"replay": "prioritized", "replay_capacity": 64, "replay_groups": 4},
    "decoupled PPO": {"algo": "decoupled-ppo"},
    "V-trace": {"algo": "vtrace"},
    "all (aggressive)": {"preset": "aggressive"},
}


def ablation(max_staleness: int, trainer_delay_s: float) -> dict[str, dict[str, Any]]:
    """Fix name -> the fully-async settings that turn it on (``RunConfig`` keywords) at
    ``max_staleness``, with a trainer slowed by ``trainer_delay_s`` per step."""
    out = {}
    for fix, over in _ABLATION.items():
        over = dict(over)
        if over.get("drop_staleness") == "quarter":
            over["drop_staleness"] = max(1, max_staleness // 4)
        trainer = {"delay_s": trainer_delay_s, **over.pop("trainer", {})}
        out[fix] = {"mode": "fully-async", "max_staleness": max_staleness,
                    "groups_per_rollout": 1, "trainer": trainer, **over}  # fmt: skip
    return out
