"""``run(EnvRunConfig) -> RunResult``: the environment producer's learner loop, the same for
every architecture (``docs/rl/actor-learner.md``), on the system's one
:class:`~nobubble.rl.system.experience.ExperienceBuffer` (trajectories admitted on arrival).
"""

from __future__ import annotations

import time
from collections import Counter, deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace

import torch
from torch import nn

from nobubble.rl.actor_learner.config import EnvRunConfig, trajectories_per_update
from nobubble.rl.actor_learner.launch import ActorPool
from nobubble.rl.actor_learner.model import (
    PolicyModel,
    Trajectory,
    TrajectoryBatch,
    env_label,
    evaluate,
    initial_model,
    stack_trajectories,
)
from nobubble.rl.algo.losses import policy_entropy, policy_gradient_loss, ppo_policy_loss
from nobubble.rl.algo.vtrace import VTraceReturns, vtrace_from_logits
from nobubble.rl.system.experience import ExperienceBuffer
from nobubble.rl.system.learner import Learner, ShardGradients
from nobubble.rl.system.result import CurvePoint, RunResult
from nobubble.rl.system.weight_sync import PublishedWeights, weight_digest

__all__ = ["VTraceLoss", "env_learner", "minibatches", "run", "vtrace_targets"]

_SUPERVISE_EVERY_S = 0.05  # how often the loop asks the pool about its actors (a failure is
# named within liveness_s anyway; checking at every ~1 ms receive cost ~5% of SEED RL's steps)


def vtrace_targets(
    logits: torch.Tensor, values: torch.Tensor, batch: TrajectoryBatch, gamma: float, lambda_: float
) -> VTraceReturns:
    """V-trace on the model's output over ``batch.obs``: ``logits (T + 1, B, A)``, ``values
    (T + 1, B)``, with gradient; the discount is 0 at dones, ``V(x_T)`` the bootstrap."""
    return vtrace_from_logits(
        behaviour_policy_logits=batch.behaviour_logits,
        target_policy_logits=logits[:-1],
        actions=batch.actions,
        discounts=gamma * (1.0 - batch.dones),
        rewards=batch.rewards,
        values=values[:-1],
        bootstrap_value=values[-1],
        lambda_=lambda_,
    )


@dataclass(frozen=True)
class VTraceLoss:
    """The environment producer's loss on a :class:`TrajectoryBatch` ``(T, b)``, for the
    :class:`~nobubble.rl.system.learner.Learner`, with the current parameters:

        vs, A = vtrace_from_logits(mu_logits, pi_logits, a, gamma * (1 - done), r, V, V_T)
        policy loss = PPO clip of pi / mu on A (``loss="ppo"``, APPO)  or  -A log pi ("vtrace")
        value loss  = 1/2 (vs - V)^2,   entropy bonus  H(pi)

    Advantages are normalised per minibatch; every step counts."""

    config: EnvRunConfig

    def after_step(self, model: nn.Module, version: int) -> None:
        pass

    def __call__(
        self, model: nn.Module, batch: TrajectoryBatch, version: int
    ) -> tuple[torch.Tensor, ShardGradients]:
        c = self.config
        logits, values = model(batch.obs)  # (T + 1, b, A), (T + 1, b)
        out = vtrace_targets(logits, values, batch, c.gamma, c.vtrace_lambda)
        logp = out.target_action_log_probs
        assert logp is not None  # set by vtrace_from_logits
        behaviour_logp = logp.detach() - out.log_rhos  # (T, b)
        adv = (out.pg_advantages - out.pg_advantages.mean()) / (out.pg_advantages.std() + 1e-8)
        mask = torch.ones_like(logp).T  # (b, T): every step counts
        if c.loss == "ppo":
            result = ppo_policy_loss(logp.T, behaviour_logp.T, adv.T, mask, c.clip, c.clip)
            policy_loss, clip_fraction = result.loss, result.clip_fraction
        else:
            policy_loss = policy_gradient_loss(logp.T, adv.T, mask)
            clip_fraction = torch.zeros(())
        value_loss = 0.5 * (out.vs - values[:-1]).square().mean()
        assert out.target_log_probs is not None  # set by vtrace_from_logits, as logp
        entropy = policy_entropy(out.target_log_probs).mean()
        loss = policy_loss + c.value_coef * value_loss - c.entropy_coef * entropy
        terms = torch.stack([policy_loss, value_loss, entropy, clip_fraction]).tolist()
        metrics = dict(zip(("policy_loss", "value_loss", "entropy", "clip_fraction"), terms))
        return loss, ShardGradients([], metrics, mask.numel())


def env_learner(model: PolicyModel, config: EnvRunConfig) -> Learner:
    """The environment producer's :class:`~nobubble.rl.system.learner.Learner` (Adam, eps 1e-5)."""
    loss = VTraceLoss(config)
    return Learner(model, loss, lr=config.lr, max_grad_norm=config.max_grad_norm, adam_eps=1e-5)


def minibatches(
    batch: TrajectoryBatch, config: EnvRunConfig, generator: torch.Generator
) -> Iterator[TrajectoryBatch]:
    """``config.epochs`` passes over ``batch``, each in ``config.minibatches`` random
    column (environment) subsets: one optimizer step each, one version in all."""
    num_envs = batch.actions.shape[1]
    for _ in range(config.epochs):
        order = torch.randperm(num_envs, generator=generator)
        for index in order.chunk(config.minibatches):
            yield batch.columns(index)


OnStep = Callable[[int, dict[str, float]], None]


class _Run:
    """The mutable state of one run (the learner's side only)."""

    def __init__(self, config: EnvRunConfig, model: PolicyModel) -> None:
        self.config = config
        self.learner = env_learner(model, config)
        self.shuffle = torch.Generator().manual_seed(config.seed)  # the minibatches' order
        self.published = PublishedWeights()  # the digest of every version the learner made
        self.published.publish({self.learner.version: weight_digest(model)})
        self.buffer = ExperienceBuffer[Trajectory](
            batch_groups=trajectories_per_update(config),
            max_staleness=config.max_staleness,
            admit_on_arrival=True,
        )
        self.num_arrived = 0  # trajectories received: the next one's group id
        self.lags: Counter[int] = Counter()  # trained env steps by lag
        self.returns: deque[float] = deque(maxlen=20)
        self.curve: list[CurvePoint] = []
        self.env_steps = 0
        self.learn_s = 0.0
        self.start = self.last_eval = time.monotonic()
        self.reached: CurvePoint | None = None  # the first evaluation at the target
        self.eval_returns: list[float] = []

    def take(self, trajectories: list[Trajectory]) -> None:
        for arrived in trajectories:
            t = replace(arrived, group_id=self.num_arrived)
            self.num_arrived += 1
            self.buffer.admit(t.group_id, self.learner.version, source=t.key)
            self.buffer.generated(t)
            self.buffer.put(t)  # scored on arrival
            self.env_steps += t.num_steps
            self.returns.extend(t.episode_returns)

    def update_if_ready(self) -> bool:
        """One update when the buffer holds an update's worth of trajectories no older than
        ``max_staleness`` (it drops older ones); False when it does not."""
        fresh = self.buffer.take_batch(self.learner.version)
        if fresh is None:
            return False
        for t in fresh:
            lag = self.learner.version - t.policy_version
            assert lag >= 0, f"trajectory {t.key} has a version from the future"
            self.lags[lag] += t.num_steps
        self.published.check_trained(  # each acted with the weights of the versions it claims
            (t.source.split("/")[0], t.source, t.weight_digests) for t in fresh
        )
        start = time.perf_counter()
        self.learner.update(minibatches(stack_trajectories(fresh), self.config, self.shuffle))
        self.learn_s += time.perf_counter() - start
        self.published.publish({self.learner.version: weight_digest(self.learner.model)})
        self.buffer.mark_trained(fresh, self.learner.version)
        return True

    def point(self, eval_return: float | None = None) -> CurvePoint:
        """The curve's point now; ``train_return``: the mean of the last 20 episodes."""
        train_return = sum(self.returns) / len(self.returns) if self.returns else None
        wall_s = time.monotonic() - self.start
        version = self.learner.version
        return CurvePoint(version, wall_s, train_return, eval_return, env_steps=self.env_steps)

    def eval_due(self) -> bool:
        """Every ``eval_every_s``; sooner (but not after every update) once the training
        return reaches the target."""
        target, train_return = self.config.target_return, self.point().train_return
        since = time.monotonic() - self.last_eval
        hot = target is not None and train_return is not None and train_return >= target
        return since >= self.config.eval_every_s or (hot and since >= self.config.eval_every_s / 5)

    def evaluate(self) -> CurvePoint:
        """Evaluate greedily; note the time and env steps the first time it reaches the target."""
        self.eval_returns = evaluate(self.learner.model, self.config)
        self.last_eval = time.monotonic()
        mean = sum(self.eval_returns) / len(self.eval_returns)
        target = self.config.target_return
        point = self.point(mean)
        if target is not None and mean >= target and self.reached is None:
            self.reached = point
        return point

    def loop(self, pool: ActorPool, on_step: OnStep | None) -> None:
        """Receive, train and evaluate until the target or a budget is reached."""
        c = self.config

        def add(point: CurvePoint) -> None:
            self.curve.append(point)
            if on_step is not None:
                named = ("wall_s", "env_steps", "train_return", "eval_return")
                metrics = {k: getattr(point, k) for k in named if getattr(point, k) is not None}
                on_step(self.learner.version, metrics)

        next_check = 0.0
        while not (
            self.reached is not None
            or self.env_steps >= c.max_env_steps
            or (c.steps is not None and self.learner.version >= c.steps)
            or time.monotonic() - self.start >= c.time_budget_s
        ):
            version = self.learner.version
            self.take(pool.receive(version, self.published.digests[version]))
            if time.monotonic() >= next_check:  # a receive takes ~1 ms; a check ~80 us
                pool.supervise()
                next_check = time.monotonic() + _SUPERVISE_EVERY_S
            while self.update_if_ready():
                pool.publish(self.learner.version)
                add(self.point())
            if self.eval_due():
                add(self.evaluate())

    def result(self, pool: ActorPool) -> RunResult:
        c, wall = self.config, time.monotonic() - self.start
        idle = {"learner": max(0.0, 1.0 - self.learn_s / wall)}
        if pool.weights is None:  # central inference
            idle["inference"] = max(0.0, 1.0 - pool.inference_busy_s / wall)
        returns = tuple(self.eval_returns)
        return RunResult(
            config=c.to_dict(),
            steps=self.learner.version,
            wall_s=wall,
            trained_samples=sum(self.lags.values()),
            curve=self.curve,
            staleness_hist=dict(self.lags),
            idle_ratio=idle,
            ledger=self.buffer.check(),
            env=env_label(c.env),
            arch=c.arch,
            actors=c.actors,
            envs_per_actor=c.envs_per_actor,
            eval_mean_return=sum(returns) / len(returns) if returns else float("nan"),
            eval_returns=returns,
            target_return=c.target_return,
            time_to_target_s=self.reached.wall_s if self.reached else None,
            steps_to_target=self.reached.env_steps if self.reached else None,
            env_steps=self.env_steps,
            model=self.learner.model,
        )


def run(config: EnvRunConfig, *, on_step: OnStep | None = None) -> RunResult:
    """Train ``config.model`` (default: an MLP actor-critic) on ``config.env`` with
    ``config.arch``; ``on_step(version, metrics)`` is called after each update and evaluation
    with ``wall_s``, ``env_steps`` and, when known, ``train_return`` and ``eval_return``.
    Raises :class:`WorkerError` when an actor raised (its error's first line; the report in
    ``remote_traceback``), died, fell silent, or sampled with other weights than the version it
    reports; ``LedgerError`` when a trajectory was lost or trained twice (a bug, never expected).
    """
    threads = torch.get_num_threads()
    torch.set_num_threads(config.threads)
    try:
        model = initial_model(config)
        state = _Run(config, model)
        pool = ActorPool(config, model)
        try:
            state.loop(pool, on_step)
        finally:
            leftover = pool.close()
        state.take(leftover)
        state.buffer.close([])  # what was in transit or waiting: "unfinished"
        if not state.eval_returns or state.reached is None:
            state.curve.append(state.evaluate())
        return state.result(pool)
    finally:
        torch.set_num_threads(threads)
