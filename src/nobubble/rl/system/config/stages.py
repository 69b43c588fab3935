"""The settings of each stage of a run: trainer, rollout, reward.

:class:`~nobubble.rl.system.config.run.RunConfig` holds one of each (``trainer``,
``rollout``, ``reward``). What more than one stage reads (``algo``, ``group_size``,
``partial_rollouts``, ``weight_check_every``, the drop bound) is the run's, stated once there.
Torch-free: a bad value is refused before torch is imported.
"""

from __future__ import annotations

from dataclasses import dataclass

from nobubble.rl.system.config.base import Settings, setting

__all__ = ["STALENESS_WEIGHTS", "LearnerConfig", "TrainerConfig", "RolloutConfig", "RewardConfig"]

STALENESS_WEIGHTS = ("none", "inverse", "exp")


@dataclass(frozen=True, kw_only=True)
class LearnerConfig(Settings):
    """The learner's settings both producers read: a task run's :class:`TrainerConfig` and an
    environment run's :class:`~nobubble.rl.actor_learner.config.EnvRunConfig` are
    LearnerConfigs (the latter with its own defaults).

    Attributes:
        lr: Adam learning rate.
        clip: PPO ratio clip epsilon.
        entropy_coef: weight of the entropy bonus.
        value_coef: weight of the value loss (the algorithms with a critic).
        max_grad_norm: gradient clipping.
    """

    lr: float = setting(2e-3, "> 0")
    clip: float = setting(0.2, "(0, 1)")
    entropy_coef: float = setting(0.0, ">= 0")
    value_coef: float = setting(0.5, ">= 0")
    max_grad_norm: float = setting(1.0, "> 0")


@dataclass(frozen=True, kw_only=True)
class TrainerConfig(LearnerConfig):
    """Optimisation settings: :class:`LearnerConfig`'s and these.

    Attributes:
        uniform_kl_coef: weight of KL(uniform || pi) per token: a floor under every token's
            probability, so a group whose samples all agree on a wrong answer still explores
            (unlike the entropy bonus, its gradient does not vanish as the policy becomes
            deterministic; greedy evaluation is unaffected).
        staleness_weighting: weight of a sample ``lag`` versions old: ``none`` (1),
            ``inverse`` (``1 / (1 + lag)``) or ``exp`` (``0.5 ** lag``).
        kl_coef: weight of KL(pi || pi_ref) (k3 estimator) to a reference policy; 0 = off.
        kl_refresh_every: copy the policy into the reference every N steps; 0 = keep the
            initial policy frozen.
        delay_s: extra seconds per step (a slower trainer for experiments).
    """

    uniform_kl_coef: float = setting(0.05, ">= 0")
    staleness_weighting: str = setting("none", STALENESS_WEIGHTS)
    kl_coef: float = setting(0.0, ">= 0")
    kl_refresh_every: int = setting(0, ">= 0", integer=True)
    delay_s: float = setting(0.0, ">= 0")


@dataclass(frozen=True, kw_only=True)
class RolloutConfig(Settings):
    """Sampling settings.

    Attributes:
        temperature: sampling temperature.
        delay_s: extra seconds per ``generate`` call (a slower generator for experiments).
        token_delay_s: extra seconds per decoding step (a slow decoder: one generation then
            spans trainer steps, the case partial rollouts are for).
    """

    temperature: float = setting(1.0, "> 0")
    delay_s: float = setting(0.0, ">= 0")
    token_delay_s: float = setting(0.0, ">= 0")


@dataclass(frozen=True, kw_only=True)
class RewardConfig(Settings):
    """How the reward stage behaves.

    Attributes:
        delay_s: seconds each reward call sleeps (a slow verifier).
        failure_rate: probability that one attempt raises.
        max_retries: retries after a failed attempt (the remote service's too).
        timeout_s: the remote service's limit per request.
        seed: seed of the injected failures (the run's: ``RunConfig.seed``).
        give_up_groups: end the run once this many groups in a row failed.
        give_up_s: end the run once groups have failed for this long with none scored.
    """

    delay_s: float = setting(0.0, ">= 0")
    failure_rate: float = setting(0.0, "[0, 1]")
    max_retries: int = setting(2, ">= 0", integer=True)
    timeout_s: float = setting(10.0, "> 0")
    seed: int = 0
    give_up_groups: int = setting(8, ">= 1", integer=True)
    give_up_s: float = setting(60.0, "> 0")
