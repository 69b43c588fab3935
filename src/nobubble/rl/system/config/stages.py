"""The settings of each stage of a run: trainer, rollout, reward.

:class:`~nobubble.rl.system.config.run.RunConfig` holds one of each (``trainer``,
``rollout``, ``reward``); the stage workers read them from the run. The settings more than one
stage reads (``algo``, ``group_size``, ``partial_rollouts``, ``weight_check_every``, the drop
bound) are the run's fields, stated once there; a stage reads them from the run too
(:attr:`RunConfig.token_drop_staleness` is the trainer's drop bound). This module loads no
torch, so a bad value is refused before any is imported.
"""

from __future__ import annotations

from dataclasses import dataclass

from nobubble.validation import check_fields

__all__ = ["STALENESS_WEIGHTS", "LearnerConfig", "TrainerConfig", "RolloutConfig", "RewardConfig"]

STALENESS_WEIGHTS = ("none", "inverse", "exp")


@dataclass(frozen=True, kw_only=True)
class LearnerConfig:
    """The learner's settings both producers read, with the same meaning: a task run's
    :class:`TrainerConfig` and an environment run's
    :class:`~nobubble.rl.actor_learner.config.EnvRunConfig` are LearnerConfigs (the latter
    with its own defaults).

    Attributes:
        lr: Adam learning rate.
        clip: PPO ratio clip epsilon, in (0, 1).
        entropy_coef: weight of the entropy bonus.
        value_coef: weight of the value loss (the algorithms with a critic).
        max_grad_norm: gradient clipping.
    """

    lr: float = 2e-3
    clip: float = 0.2
    entropy_coef: float = 0.0
    value_coef: float = 0.5
    max_grad_norm: float = 1.0

    def __post_init__(self) -> None:
        owner = type(self).__name__
        check_fields(owner, self, ("lr", "max_grad_norm"), "> 0")
        check_fields(owner, self, ("entropy_coef", "value_coef"), ">= 0")
        if not 0.0 < self.clip < 1.0:
            raise ValueError(f"{owner}.clip={self.clip} must be in (0, 1) (e.g. 0.2)")


@dataclass(frozen=True, kw_only=True)
class TrainerConfig(LearnerConfig):
    """Optimisation settings: :class:`LearnerConfig`'s and these (the algorithm, the group
    size and the drop bound are the run's: ``RunConfig.algo``, ``.group_size``,
    ``.token_drop_staleness``).

    Attributes:
        uniform_kl_coef: weight of KL(uniform || pi) per token. It keeps a floor under every
            token's probability, so a group whose samples all agree on a wrong answer still
            explores; unlike the entropy bonus, its gradient does not vanish as the policy
            becomes deterministic. Greedy evaluation is unaffected by the floor.
        staleness_weighting: weight of a sample ``lag`` versions old: ``none`` (1),
            ``inverse`` (``1 / (1 + lag)``) or ``exp`` (``0.5 ** lag``).
        kl_coef: weight of KL(pi || pi_ref) (k3 estimator) to a reference policy; 0 = off.
        kl_refresh_every: copy the policy into the reference every N steps; 0 = keep the
            initial policy frozen.
        delay_s: extra seconds per step (a slower trainer for experiments).
    """

    uniform_kl_coef: float = 0.05
    staleness_weighting: str = "none"
    kl_coef: float = 0.0
    kl_refresh_every: int = 0
    delay_s: float = 0.0

    def __post_init__(self) -> None:
        super().__post_init__()
        check_fields("TrainerConfig", self, ("uniform_kl_coef", "kl_coef", "delay_s"), ">= 0")
        check_fields("TrainerConfig", self, ("kl_refresh_every",), ">= 0", integer=True)
        if self.staleness_weighting not in STALENESS_WEIGHTS:
            raise ValueError(
                f"TrainerConfig.staleness_weighting={self.staleness_weighting!r}; use one of "
                f"{', '.join(STALENESS_WEIGHTS)}"
            )


@dataclass(frozen=True, kw_only=True)
class RolloutConfig:
    """Sampling settings (the group size and in-flight weight updates are the run's:
    ``RunConfig.group_size``, ``.partial_rollouts``, ``.weight_check_every``).

    Attributes:
        temperature: sampling temperature, > 0.
        delay_s: extra seconds per ``generate`` call (a slower generator for experiments).
        token_delay_s: extra seconds per decoding step (a slow decoder: one generation then
            spans trainer steps, the case partial rollouts are for).
    """

    temperature: float = 1.0
    delay_s: float = 0.0
    token_delay_s: float = 0.0

    def __post_init__(self) -> None:
        check_fields("RolloutConfig", self, ("temperature",), "> 0")
        check_fields("RolloutConfig", self, ("delay_s", "token_delay_s"), ">= 0")


@dataclass(frozen=True, kw_only=True)
class RewardConfig:
    """How the reward stage behaves.

    Attributes:
        delay_s: seconds each reward call sleeps (a slow verifier), >= 0.
        failure_rate: probability that one attempt raises, in [0, 1].
        max_retries: retries after a failed attempt, >= 0 (the remote service's too).
        timeout_s: the remote service's limit per request, > 0.
        seed: seed of the injected failures.
        give_up_groups: end the run once this many groups in a row failed, >= 1.
        give_up_s: end the run once groups have failed for this long with none scored, > 0.
    """

    delay_s: float = 0.0
    failure_rate: float = 0.0
    max_retries: int = 2
    timeout_s: float = 10.0
    seed: int = 0
    give_up_groups: int = 8
    give_up_s: float = 60.0

    def __post_init__(self) -> None:
        check_fields("RewardConfig", self, ("delay_s",), ">= 0")
        if not 0.0 <= self.failure_rate <= 1.0:
            raise ValueError(f"RewardConfig.failure_rate={self.failure_rate} must be in [0, 1]")
        check_fields("RewardConfig", self, ("max_retries",), ">= 0", integer=True)
        check_fields("RewardConfig", self, ("give_up_groups",), ">= 1", integer=True)
        check_fields("RewardConfig", self, ("timeout_s", "give_up_s"), "> 0")
