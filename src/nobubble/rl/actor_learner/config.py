"""One actor-learner run's configuration (environment, architecture, learner, budget), frozen
and checked when built; the three architectures share every field (one only one reads says so)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from nobubble.rl.system.config import LearnerConfig, RLConfig, setting

__all__ = [
    "ARCHS",
    "Arch",
    "EnvRunConfig",
    "LOSSES",
    "envs_per_trajectory",
    "trajectories_per_update",
]

Arch = Literal["impala", "seed", "sample-factory"]
ARCHS: tuple[str, ...] = ("impala", "seed", "sample-factory")
LOSSES: tuple[str, ...] = ("ppo", "vtrace")


@dataclass(frozen=True, kw_only=True)
class EnvRunConfig(RLConfig, LearnerConfig):
    """An actor-learner run on a gymnasium (or :mod:`~nobubble.rl.actor_learner.text`) env:
    :class:`RLConfig`'s and :class:`LearnerConfig`'s settings (these defaults) and these."""

    # a gymnasium id or a zero-argument factory of a gymnasium.Env (picklable unless the
    # start method is fork)
    env: str | Callable[[], Any] = "CartPole-v1"
    # sample-factory: central inference, two double-buffered env groups per worker
    arch: Arch = setting(
        "seed", ARCHS, help="impala: inference in each actor; seed, sample-factory: central"
    )
    actors: int = setting(2, ">= 1", integer=True, help="actor (rollout worker) processes")
    envs_per_actor: int = setting(8, ">= 1", integer=True, help="environments each actor steps")
    env_step_delay_ms: float = setting(0.0, ">= 0", help="sleep per env step (a slow simulator)")
    unroll_length: int = setting(32, ">= 1", integer=True)  # steps per trajectory (T)
    # actor unrolls per update, each envs_per_actor envs x unroll_length steps (sample-factory:
    # a worker's two group trajectories count as one unroll)
    batch_trajectories: int = setting(2, ">= 1", integer=True)
    epochs: int = setting(4, ">= 1", integer=True)  # per batch (1: IMPALA; > 1: APPO)
    minibatches: int = 2  # per epoch, split over the batch's environments
    loss: str = setting("ppo", LOSSES, help="ppo (APPO: clip on V-trace advantages) or vtrace")
    lr: float = 2.5e-3
    max_grad_norm: float = 0.5
    gamma: float = setting(0.99, "[0, 1]")
    vtrace_lambda: float = setting(0.95, "[0, 1]")  # rlax's trace-cutting lambda (1: V-trace)
    hidden: int = setting(64, ">= 1", integer=True)  # width of the MLP actor-critic's layers
    # a factory (obs_dim, num_actions) -> PolicyModel (.model) the learner trains and the actors
    # run, e.g. the text policy (.text); None: the MLP actor-critic. Picklable unless fork
    model: Callable[[int, int], Any] | None = None
    max_staleness: int = 4
    inference_deadline_ms: float = setting(2.0, ">= 0")  # central inference's wait for a batch
    max_env_steps: int = setting(2_000_000, ">= 1", integer=True, help="stop after N env steps")
    time_budget_s: float = 300.0
    target_return: float | None = setting(
        475.0,
        None,
        help="stop at this greedy eval mean (none: never; default: the env's - CartPole-v1 475, "
        "Acrobot-v1 -100, text envs success 0.8)",
    )
    eval_episodes: int = setting(20, ">= 1", integer=True)
    # evaluate at least this often, and whenever the training return reaches the target
    eval_every_s: float = setting(5.0, "> 0")
    stall_timeout_s: float = 60.0
    start_method: str = setting("fork", ("fork", "forkserver", "spawn"))  # of the actors

    def __post_init__(self) -> None:
        super().__post_init__()
        if not (isinstance(self.env, str) and self.env) and not callable(self.env):
            raise ValueError(
                f"env={self.env!r}: pass a gymnasium id such as 'CartPole-v1' or a factory"
            )
        if self.model is not None and not callable(self.model):
            raise ValueError(
                f"model={self.model!r} is not callable; pass a factory (obs_dim, num_actions) "
                "-> model, or None for the MLP actor-critic"
            )
        if self.arch == "sample-factory" and (self.envs_per_actor < 2 or self.envs_per_actor % 2):
            raise ValueError(
                f"envs_per_actor={self.envs_per_actor}: sample-factory splits each worker's "
                "envs into two groups; use envs_per_actor >= 2 (an even number)"
            )
        per_batch = self.batch_trajectories * self.envs_per_actor
        if not (isinstance(self.minibatches, int) and 1 <= self.minibatches <= per_batch):
            raise ValueError(
                f"minibatches={self.minibatches} must be in [1, {per_batch}] (the environments "
                "in one batch: batch_trajectories x envs per trajectory)"
            )


def envs_per_trajectory(c: EnvRunConfig) -> int:
    """Environments in one trajectory: a worker's envs, or one group of them (sample-factory)."""
    return c.envs_per_actor // 2 if c.arch == "sample-factory" else c.envs_per_actor


def trajectories_per_update(c: EnvRunConfig) -> int:
    """Trajectories one update takes: ``batch_trajectories`` unrolls of ``envs_per_actor``."""
    return c.batch_trajectories * (c.envs_per_actor // envs_per_trajectory(c))
