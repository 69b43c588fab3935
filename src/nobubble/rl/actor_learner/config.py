"""One actor-learner run's configuration: environment, architecture, learner, budget.

:class:`EnvRunConfig` is keyword-only and frozen; ``__post_init__`` refuses bad values with
a ``ValueError`` that names the value and the fix. It is an
:class:`~nobubble.rl.system.config.RLConfig`: the settings a task run has too (seed, steps,
time budget, max staleness, threads, stall timeout) are declared and checked there; and a
:class:`~nobubble.rl.system.config.stages.LearnerConfig`: the learner's settings a task run's
trainer has too (lr, clip, entropy and value coefficients, gradient clipping) are declared and
checked there. The three architectures share every field; the ones only one of them reads say
so.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from nobubble.rl.system.config.base import RLConfig
from nobubble.rl.system.config.stages import LearnerConfig
from nobubble.validation import check_fields

__all__ = [
    "ARCHS",
    "Arch",
    "EnvRunConfig",
    "LOSSES",
    "PolicyLoss",
    "envs_per_trajectory",
    "trajectories_per_update",
]

Arch = Literal["impala", "seed", "sample-factory"]
ARCHS: tuple[str, ...] = ("impala", "seed", "sample-factory")
PolicyLoss = Literal["ppo", "vtrace"]
LOSSES: tuple[str, ...] = ("ppo", "vtrace")
_START_METHODS = ("fork", "forkserver", "spawn")


@dataclass(frozen=True, kw_only=True)
class EnvRunConfig(RLConfig, LearnerConfig):
    """An actor-learner run on a gymnasium environment (a text environment is one too, through
    :mod:`nobubble.rl.actor_learner.text`): :class:`RLConfig`'s settings (``steps`` are
    learner updates, None: no bound but the others), :class:`LearnerConfig`'s (Adam's ``lr``
    2.5e-3 and ``max_grad_norm`` 0.5 by default here) and these."""

    env: str | Callable[[], Any] = "CartPole-v1"
    """A gymnasium id (``gymnasium.make(env)``) or a zero-argument factory of a
    ``gymnasium.Env`` (with the ``fork`` start method, any callable; otherwise picklable)."""
    arch: Arch = "seed"
    """``impala``: actors hold a policy copy; ``seed``: central batched inference;
    ``sample-factory``: central inference, two double-buffered env groups per worker."""
    actors: int = 2
    """Actor (rollout worker) processes."""
    envs_per_actor: int = 8
    """Environments stepped by one actor (split into two groups for sample-factory)."""
    env_step_delay_ms: float = 0.0
    """Sleep this long per environment step: a stand-in for a slow simulator or tool."""
    unroll_length: int = 32
    """Steps per trajectory (T)."""
    batch_trajectories: int = 2
    """Actor unrolls per update, each ``envs_per_actor`` envs x ``unroll_length`` steps (for
    sample-factory, a worker's two group trajectories count as one unroll)."""
    epochs: int = 4
    """Passes over each batch (1 = IMPALA's single V-trace step; >1 = APPO)."""
    minibatches: int = 2
    """Minibatches per epoch, split over the batch's environments."""
    loss: PolicyLoss = "ppo"
    """``ppo``: PPO clip on V-trace advantages (APPO); ``vtrace``: IMPALA's policy gradient."""
    lr: float = 2.5e-3
    max_grad_norm: float = 0.5
    gamma: float = 0.99
    vtrace_lambda: float = 0.95
    """rlax's trace-cutting lambda (1 = the paper's V-trace)."""
    hidden: int = 64
    """Width of the MLP actor-critic's two hidden layers."""
    model: Callable[[int, int], Any] | None = None
    """A factory ``(obs_dim, num_actions) -> model`` of the policy the learner trains and the
    actors run (see :class:`~nobubble.rl.actor_learner.model.PolicyModel`), e.g. the text
    policy of :mod:`nobubble.rl.actor_learner.text`; None: the MLP actor-critic of width
    ``hidden``. Picklable unless the start method is ``fork``."""
    max_staleness: int = 4
    inference_deadline_ms: float = 2.0
    """Central inference (seed, sample-factory) waits at most this long to fill a batch."""
    max_env_steps: int = 2_000_000
    """Stop after this many environment steps (a bound, for tests and benchmarks)."""
    time_budget_s: float = 300.0
    target_return: float | None = 475.0
    """Stop once the greedy eval mean reaches it (None: run the whole budget)."""
    eval_episodes: int = 20
    eval_every_s: float = 5.0
    """Evaluate at least this often; also whenever the training return reaches the target."""
    stall_timeout_s: float = 60.0
    start_method: str = "fork"
    """multiprocessing start method for the actors."""

    def __post_init__(self) -> None:
        super().__post_init__()
        LearnerConfig.__post_init__(self)
        _check_choices(self)
        _check_counts(self)
        _check_rates(self)


def _check_choices(c: EnvRunConfig) -> None:
    if c.arch not in ARCHS:
        raise ValueError(f"arch={c.arch!r} is not an architecture; use one of {ARCHS}")
    if c.loss not in LOSSES:
        raise ValueError(f"loss={c.loss!r}; use one of {LOSSES}")
    if c.start_method not in _START_METHODS:
        raise ValueError(f"start_method={c.start_method!r}; use one of {_START_METHODS}")
    if not (isinstance(c.env, str) and c.env) and not callable(c.env):
        raise ValueError(f"env={c.env!r}: pass a gymnasium id such as 'CartPole-v1' or a factory")
    if c.model is not None and not callable(c.model):
        raise ValueError(
            f"model={c.model!r} is not callable; pass a factory (obs_dim, num_actions) -> "
            "model, or None for the MLP actor-critic"
        )


def _check_counts(c: EnvRunConfig) -> None:
    counts = ("actors", "envs_per_actor", "unroll_length", "batch_trajectories", "epochs",
              "eval_episodes", "hidden", "max_env_steps")  # fmt: skip
    check_fields("EnvRunConfig", c, counts, ">= 1", integer=True)
    if c.arch == "sample-factory" and (c.envs_per_actor < 2 or c.envs_per_actor % 2):
        raise ValueError(
            f"envs_per_actor={c.envs_per_actor}: sample-factory splits each worker's envs into "
            "two groups; use envs_per_actor >= 2 (an even number)"
        )
    per_batch = c.batch_trajectories * c.envs_per_actor
    if c.minibatches < 1 or c.minibatches > per_batch:
        raise ValueError(
            f"minibatches={c.minibatches} must be in [1, {per_batch}] (the environments in one "
            "batch: batch_trajectories x envs per trajectory)"
        )


def _check_rates(c: EnvRunConfig) -> None:
    # check_value refuses NaN, inf and 1e308 too
    check_fields("EnvRunConfig", c, ("eval_every_s",), "> 0")
    check_fields("EnvRunConfig", c, ("env_step_delay_ms", "inference_deadline_ms"), ">= 0")
    if not 0.0 <= c.gamma <= 1.0:
        raise ValueError(f"gamma={c.gamma} must be in [0, 1] (e.g. 0.99)")
    if not 0.0 <= c.vtrace_lambda <= 1.0:
        raise ValueError(f"vtrace_lambda={c.vtrace_lambda} must be in [0, 1] (1 = V-trace)")


def envs_per_trajectory(c: EnvRunConfig) -> int:
    """Environments in one trajectory: a worker's envs, or one group of them (sample-factory)."""
    return c.envs_per_actor // 2 if c.arch == "sample-factory" else c.envs_per_actor


def trajectories_per_update(c: EnvRunConfig) -> int:
    """Trajectories one update takes: ``batch_trajectories`` unrolls of ``envs_per_actor``."""
    return c.batch_trajectories * (c.envs_per_actor // envs_per_trajectory(c))
