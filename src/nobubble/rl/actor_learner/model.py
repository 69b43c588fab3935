"""Gymnasium envs, the model contract and what models make: actions (:func:`act`),
trajectories, an IMPALA actor's unroll (:func:`rollout`) and :func:`evaluate`. Truncation
ends an episode without bootstrap. Shapes are time-major, as V-trace takes them: ``T``
steps, ``K`` environments, ``D`` observation features, ``A`` actions.
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any, Protocol

import gymnasium
import numpy as np
import torch
from torch import nn

from nobubble.rl.actor_learner.config import EnvRunConfig
from nobubble.validation import check_value

__all__ = [
    "ActorCritic",
    "PolicyModel",
    "StepDelay",
    "Trajectory",
    "TrajectoryBatch",
    "TrajectoryBuilder",
    "act",
    "build_model",
    "env_label",
    "env_spaces",
    "evaluate",
    "initial_model",
    "make_env",
    "rollout",
    "stack_trajectories",
    "vector_env",
]


class StepDelay(gymnasium.Wrapper):
    """Wrap a gymnasium env so that every ``step`` first sleeps ``delay_ms`` milliseconds."""

    def __init__(self, env: Any, delay_ms: float) -> None:
        super().__init__(env)
        self.delay_s = delay_ms / 1000.0

    def step(self, action: Any) -> Any:
        if self.delay_s > 0:
            time.sleep(self.delay_s)
        return self.env.step(action)


def make_env(env: str | Callable[[], Any], delay_ms: float = 0.0) -> Any:
    """One environment: ``gymnasium.make(env)`` or ``env()``, wrapped in :class:`StepDelay`
    when ``delay_ms > 0``."""
    made = gymnasium.make(env, disable_env_checker=True) if isinstance(env, str) else env()
    return StepDelay(made, delay_ms) if delay_ms > 0 else made


def env_label(env: str | Callable[[], Any]) -> str:
    """A run's name for ``env``: the gymnasium id, else the factory's ``name`` or
    ``__name__`` (``"custom"`` when it has neither)."""
    if isinstance(env, str):
        return env
    return str(getattr(env, "name", None) or getattr(env, "__name__", "custom"))


def env_spaces(env: str | Callable[[], Any]) -> tuple[int, int]:
    """``(obs_dim, num_actions)`` of a flat-Box-observation, Discrete-action environment
    (``ValueError`` for other spaces: this core's MLP policy needs those)."""
    probe = make_env(env)
    obs_space, act_space = probe.observation_space, probe.action_space
    probe.close()
    if not isinstance(obs_space, gymnasium.spaces.Box) or len(obs_space.shape) != 1:
        raise ValueError(
            f"env={env!r} has observation space {obs_space}; the MLP actor-critic needs a "
            "flat Box (vector observations): pick such an env or flatten it in a factory"
        )
    if not isinstance(act_space, gymnasium.spaces.Discrete):
        raise ValueError(
            f"env={env!r} has action space {act_space}; the categorical policy needs Discrete"
        )
    return int(obs_space.shape[0]), int(act_space.n)


def vector_env(
    env: str | Callable[[], Any], num_envs: int, delay_ms: float = 0.0
) -> gymnasium.vector.SyncVectorEnv:
    """``num_envs`` environments of :func:`make_env` stepped in turn, each reset in the step
    its episode ends (``SAME_STEP``: the observation of a finished one is the first of its
    next episode; ``terminated | truncated`` marks the end); ``reset(seed=s)`` seeds them
    ``s, s + 1, ...``."""
    check_value("vector_env: num_envs", num_envs, ">= 1", integer=True)
    make = functools.partial(make_env, env, delay_ms)
    same_step = gymnasium.vector.AutoresetMode.SAME_STEP
    return gymnasium.vector.SyncVectorEnv([make] * num_envs, autoreset_mode=same_step)


class PolicyModel(Protocol):
    """What the learner, the actors and central inference need of a model (an ``nn.Module``):
    ``model(obs (..., D)) -> (logits (..., A), value (...))`` and ``model.policy(obs (N, D))
    -> logits (N, A)``, float32; ``obs_dim`` (D) and ``num_actions`` (A) as the env's spaces
    give them. The optimiser and the impala weight broadcast see the module's parameters, so
    two models made by the same factory must have the same shapes."""

    obs_dim: int
    num_actions: int

    def __call__(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]: ...
    def policy(self, obs: torch.Tensor) -> torch.Tensor: ...


def build_model(config: EnvRunConfig, obs_dim: int, num_actions: int) -> Any:
    """``config.model(obs_dim, num_actions)``, or the MLP :class:`ActorCritic`; ``ValueError``
    when the factory's model disagrees with the env's spaces."""
    if config.model is None:
        return ActorCritic(obs_dim, num_actions, config.hidden)
    model = config.model(obs_dim, num_actions)
    made = (getattr(model, "obs_dim", None), getattr(model, "num_actions", None))
    if made != (obs_dim, num_actions):
        raise ValueError(
            f"model factory {config.model!r} made a model with obs_dim={made[0]}, "
            f"num_actions={made[1]}; the env has obs_dim={obs_dim}, num_actions={num_actions}"
        )
    return model


def initial_model(config: EnvRunConfig) -> Any:
    """The untrained model ``train(config)`` starts from: :func:`build_model` for
    ``config.env``'s spaces after ``torch.manual_seed(config.seed)``."""
    torch.manual_seed(config.seed)
    return build_model(config, *env_spaces(config.env))


def _mlp(n_in: int, hidden: int, n_out: int, last_gain: float) -> nn.Sequential:
    """Two orthogonally initialised tanh layers of width ``hidden``, then a linear one."""
    layers: list[nn.Module] = []
    for a, b, gain in ((n_in, hidden, math.sqrt(2.0)), (hidden, hidden, math.sqrt(2.0)),
                       (hidden, n_out, last_gain)):  # fmt: skip
        layer = nn.Linear(a, b)
        nn.init.orthogonal_(layer.weight, gain)
        nn.init.zeros_(layer.bias)
        layers += [layer, nn.Tanh()]
    return nn.Sequential(*layers[:-1])


class ActorCritic(nn.Module):
    """``obs (..., D) -> (logits (..., A), value (...))``: two separate tanh MLPs, orthogonally
    initialised with a small last policy layer as in cleanrl's ``ppo.py`` (the policy starts
    near uniform; the value loss pulls at no feature the policy uses)."""

    def __init__(self, obs_dim: int, num_actions: int, hidden: int = 64) -> None:
        super().__init__()
        self.obs_dim, self.num_actions = obs_dim, num_actions
        self.policy = _mlp(obs_dim, hidden, num_actions, 0.01)
        self.value = _mlp(obs_dim, hidden, 1, 1.0)

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.policy(obs), self.value(obs).squeeze(-1)


@dataclass(frozen=True)
class Trajectory:
    """One unroll; to the :class:`~nobubble.rl.system.experience.ExperienceBuffer` one group of
    one sample, whose rewards came with its steps (``reward_failed`` is always False)."""

    source: str  # the actor (and env group) that stepped it, e.g. "actor-1/group-0"
    seq: int  # its number among that source's trajectories, from 0 (the ledger's key)
    policy_version: int  # the oldest policy version that chose one of its actions
    obs: np.ndarray  # (T + 1, K, D) float32; the last one only bootstraps the value
    actions: np.ndarray  # (T, K) int64
    behaviour_logits: np.ndarray  # (T, K, A) float32, the logits the actions were sampled from
    rewards: np.ndarray  # (T, K) float32
    dones: np.ndarray  # (T, K) bool: the episode ended at step t (no bootstrap across it)
    episode_returns: tuple[float, ...]  # of the episodes that ended inside this unroll
    # (version, weight_digest) of every policy version that chose one of its actions, hashed
    # by whoever acted (actor or central inference); the learner checks them
    weight_digests: tuple[tuple[int, str], ...] = ()
    group_id: int = -1  # its number among the trajectories the learner received
    reward_failed: bool = False

    @property
    def sample_ids(self) -> tuple[int, ...]:
        return (self.group_id,)

    @property
    def newest_version(self) -> int:
        return self.policy_version

    @property
    def key(self) -> tuple[str, int]:
        """``(source, seq)``: which trajectory of which source it is (the ledger's gap check)."""
        return self.source, self.seq

    @property
    def num_steps(self) -> int:
        """Environment steps in it: ``T * K``."""
        return int(self.actions.size)


@dataclass(frozen=True)
class TrajectoryBatch:
    """Trajectories side by side along the environment axis (``B = sum K``), as tensors."""

    obs: torch.Tensor  # (T + 1, B, D)
    actions: torch.Tensor  # (T, B)
    behaviour_logits: torch.Tensor  # (T, B, A)
    rewards: torch.Tensor  # (T, B)
    dones: torch.Tensor  # (T, B) float: 1 where the episode ended

    def columns(self, index: torch.Tensor) -> TrajectoryBatch:
        """The environments ``index`` (``(b,)`` int64) of this batch."""
        return TrajectoryBatch(**{f.name: getattr(self, f.name)[:, index] for f in fields(self)})


def stack_trajectories(trajectories: list[Trajectory]) -> TrajectoryBatch:
    """Concatenate trajectories of equal ``T`` along the environment axis."""
    if not trajectories:
        raise ValueError("stack_trajectories: no trajectories; pass at least one")
    lengths = {t.actions.shape[0] for t in trajectories}
    if len(lengths) != 1:
        raise ValueError(f"stack_trajectories: unroll lengths {sorted(lengths)} differ")
    columns = {
        f.name: torch.from_numpy(np.concatenate([getattr(t, f.name) for t in trajectories], 1))
        for f in fields(TrajectoryBatch)
    }
    return TrajectoryBatch(**{**columns, "dones": columns["dones"].float()})


# a trajectory's step arrays in its field order, by numpy typecode: float32, int64, float32,
# float32, bool
_STEP_DTYPES = {"obs": "f", "actions": "q", "behaviour_logits": "f", "rewards": "f", "dones": "?"}


class TrajectoryBuilder:
    """Assembles the trajectories of one env stream (an impala actor's envs, or a worker's
    env group as central inference sees it). Lifecycle per step ``t``: :meth:`observe` (the
    observation after the previous action, with that action's reward and done) then
    :meth:`record` (the action chosen for it). Every ``T`` steps :meth:`observe` returns the
    finished trajectory, whose last observation is also the first of the next one. Episode
    returns are summed here from the rewards."""

    def __init__(self, source: str, unroll_length: int) -> None:
        self.source, self.T, self._seq = source, unroll_length, 0
        self._running: np.ndarray | None = None  # (K,) float64 episode sums from the first reward
        self._new()

    def _new(self) -> None:
        self.steps: dict[str, list[np.ndarray]] = {name: [] for name in _STEP_DTYPES}
        self.version = -1
        self.returns: list[float] = []
        self.claims: dict[int, str] = {}  # version -> digest of the weights that acted

    def observe(
        self, obs: np.ndarray, reward: np.ndarray | None = None, done: np.ndarray | None = None
    ) -> Trajectory | None:
        """Record ``obs (K, D)`` and the previous action's ``reward (K,)``, ``done (K,)`` bool
        (none before the first action)."""
        steps = self.steps
        if len(steps["rewards"]) < len(steps["actions"]):  # the last action's reward is due
            assert reward is not None and done is not None, f"{self.source}: no reward, done"
            steps["rewards"].append(reward)
            steps["dones"].append(done)
            if self._running is None:
                self._running = np.zeros(np.shape(reward), dtype=np.float64)
            self._running += reward
            if done.any():
                self.returns += self._running[done].tolist()
                self._running[done] = 0.0
        steps["obs"].append(obs)
        if len(steps["actions"]) < self.T:
            return None
        data: list[Any] = [
            np.stack(v).astype(_STEP_DTYPES[k], copy=False) for k, v in steps.items()
        ]
        data += [tuple(self.returns), tuple(sorted(self.claims.items()))]
        finished = Trajectory(self.source, self._seq, self.version, *data)
        self._seq += 1
        self._new()
        self.steps["obs"].append(obs)
        return finished

    def record(
        self, actions: np.ndarray, logits: np.ndarray, version: int, digest: str = ""
    ) -> None:
        """The actions ``(K,)`` and logits ``(K, A)`` chosen by policy ``version``, whose
        weights hash to ``digest``."""
        self.steps["actions"].append(actions)
        self.steps["behaviour_logits"].append(logits)
        self.version = version if self.version < 0 else min(self.version, version)
        self.claims[version] = digest


@torch.no_grad()
def act(
    model: PolicyModel, obs: np.ndarray, generator: torch.Generator | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Sample actions for ``obs (N, D)`` float32: ``actions (N,)`` int64 and the behaviour
    ``logits (N, A)`` float32; greedy (``argmax``) when ``generator`` is None."""
    logits = model.policy(torch.as_tensor(obs, dtype=torch.float32))  # (N, A)
    if generator is None:
        return logits.argmax(-1).numpy(), logits.numpy()
    probs = torch.softmax(logits, dim=-1)
    actions = torch.multinomial(probs, 1, generator=generator).squeeze(-1)  # (N,)
    return actions.numpy(), logits.numpy()


def rollout(
    model: PolicyModel,
    envs: gymnasium.vector.VectorEnv,
    builder: TrajectoryBuilder,
    obs: np.ndarray,
    *,
    version: int,
    generator: torch.Generator,
    digest: str = "",
) -> tuple[Trajectory, np.ndarray]:
    """Step ``envs`` (a :func:`vector_env`) from ``obs (K, D)``, the last observation
    ``builder`` saw, with ``model`` (policy ``version``, whose weights hash to ``digest``)
    until ``builder`` finishes a trajectory of ``T`` steps; that trajectory and the
    observation ``(K, D)`` to start the next one from."""
    while True:
        actions, logits = act(model, obs, generator)
        builder.record(actions, logits, version, digest)
        obs, rewards, terminated, truncated, _ = envs.step(actions)
        trajectory = builder.observe(obs, rewards, terminated | truncated)
        if trajectory is not None:
            return trajectory, obs


@torch.no_grad()
def evaluate(
    model: PolicyModel | None,
    config: EnvRunConfig,
    episodes: int | None = None,
    *,
    seed: int | None = None,
    sampled: bool = False,
    max_steps: int = 100_000,
) -> list[float]:
    """The return of the first episode of each of ``episodes`` (default
    ``config.eval_episodes``) fresh envs of ``config.env`` without the step delay, seeded
    ``seed, seed + 1, ...`` (default ``10_000_000 + config.seed``: apart from every actor's),
    acting with ``model`` (None: the untrained one ``train(config)`` starts from) by ``argmax``,
    or by sampling with a generator seeded with ``seed`` when ``sampled``."""
    model = initial_model(config) if model is None else model
    episodes = config.eval_episodes if episodes is None else episodes
    seed = 10_000_000 + config.seed if seed is None else seed
    generator = torch.Generator().manual_seed(seed) if sampled else None
    envs = vector_env(config.env, episodes)
    obs, _ = envs.reset(seed=seed)
    returns = np.full(episodes, np.nan)  # (K,) each env's first episode's return, once over
    running = np.zeros(episodes)
    for _ in range(max_steps):
        obs, rewards, terminated, truncated, _ = envs.step(act(model, obs, generator)[0])
        dones = terminated | truncated
        running += rewards
        first = dones & np.isnan(returns)
        returns[first], running[dones] = running[first], 0.0
        if not np.isnan(returns).any():
            break
    envs.close()
    return np.where(np.isnan(returns), running, returns).tolist()
