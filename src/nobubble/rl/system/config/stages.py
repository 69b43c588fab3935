"""The settings of each stage of a run, which ``RunConfig.trainer`` / ``.rollout`` /
``.reward`` hold; what more than one stage reads (``algo``, ``group_size``, the drop bound)
is the run's. Torch-free."""

from __future__ import annotations

from dataclasses import dataclass

from nobubble.rl.system.config.base import Settings, setting

__all__ = ["STALENESS_WEIGHTS", "LearnerConfig", "TrainerConfig", "RolloutConfig", "RewardConfig"]

STALENESS_WEIGHTS = ("none", "inverse", "exp")


@dataclass(frozen=True, kw_only=True)
class LearnerConfig(Settings):
    """The learner's settings both producers read: a task run's :class:`TrainerConfig` and an
    environment run's :class:`~nobubble.rl.actor_learner.config.EnvRunConfig` (with its own
    defaults)."""

    lr: float = setting(2e-3, "> 0")  # Adam's learning rate
    clip: float = setting(0.2, "(0, 1)")  # PPO ratio clip epsilon
    entropy_coef: float = setting(0.0, ">= 0")  # weight of the entropy bonus
    value_coef: float = setting(0.5, ">= 0")  # weight of the value loss (with a critic)
    max_grad_norm: float = setting(1.0, "> 0")  # gradient clipping


@dataclass(frozen=True, kw_only=True)
class TrainerConfig(LearnerConfig):
    """Optimisation settings: :class:`LearnerConfig`'s and these."""

    # weight of KL(uniform || pi) per token: a floor under every token's probability, so a
    # group whose samples all agree on a wrong answer still explores (unlike the entropy
    # bonus, its gradient does not vanish as the policy becomes deterministic)
    uniform_kl_coef: float = setting(0.05, ">= 0")
    # weight of a sample lag versions old: none 1, inverse 1 / (1 + lag), exp 0.5 ** lag
    staleness_weighting: str = setting("none", STALENESS_WEIGHTS)
    kl_coef: float = setting(0.0, ">= 0")  # weight of KL(pi || pi_ref) (k3); 0 = off
    # copy the policy into the reference every N steps; 0 = keep the initial policy
    kl_refresh_every: int = setting(0, ">= 0", integer=True)
    delay_s: float = setting(0.0, ">= 0")  # extra seconds per step (a slower trainer)


@dataclass(frozen=True, kw_only=True)
class RolloutConfig(Settings):
    """Sampling settings."""

    temperature: float = setting(1.0, "> 0")
    delay_s: float = setting(0.0, ">= 0")  # extra seconds per generate call
    # extra seconds per decoding step: a slow decoder, whose generation spans trainer steps
    token_delay_s: float = setting(0.0, ">= 0")


@dataclass(frozen=True, kw_only=True)
class RewardConfig(Settings):
    """How the reward stage behaves."""

    delay_s: float = setting(0.0, ">= 0")  # seconds each reward call sleeps (a slow verifier)
    failure_rate: float = setting(0.0, "[0, 1]")  # probability that one attempt raises
    max_retries: int = setting(2, ">= 0", integer=True)  # after a failed attempt (remote too)
    timeout_s: float = setting(10.0, "> 0")  # the remote service's limit per request
    seed: int = 0  # of the injected failures: the run's (RunConfig.seed)
    give_up_groups: int = setting(8, ">= 1", integer=True)  # end after this many fail in a row
    give_up_s: float = setting(60.0, "> 0")  # end once failing this long with none scored
