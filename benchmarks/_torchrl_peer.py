"""TorchRL PPO on CartPole-v1, the peer that ``rl_actor_learner.py`` measures beside SB3 PPO.

Built from torchrl's own parts as a torchrl user would: ``GymWrapper`` around the same
gymnasium env SB3 gets (``make_env``, with its ``StepDelay`` wrapper at 1 ms), ``SerialEnv``
of 8 envs with a ``RewardSum`` transform, a ``ProbabilisticActor`` and a ``ValueOperator``,
``GAE``, ``ClipPPOLoss`` and a replay buffer sampling minibatches without replacement. The
settings are SB3's CartPole PPO (its defaults with 8 envs and ``n_steps`` 32): 256 frames a
batch, 10 epochs of 4 minibatches of 64, lr 3e-4 (Adam eps 1e-5), gamma 0.99, GAE lambda
0.95, clip 0.2, value coefficient 0.5 (squared error), no entropy bonus, gradient norm 0.5,
separate 64x64 tanh MLPs with SB3's orthogonal init, 1 torch thread.

- ``asynchronous=False`` (``torchrl-ppo``): a ``Collector`` (torchrl's synchronous one,
  formerly ``SyncDataCollector``) steps the 8 envs in the learner's process, then trains.
- ``asynchronous=True`` (``torchrl-async-ppo``): a ``MultiAsyncCollector`` (formerly
  ``MultiaSyncDataCollector``) with 2 worker processes of 8 envs each keeps collecting while
  the learner trains on whichever worker's batch came first; the weights are pushed to the
  workers after each update, so a batch may come from a policy one or more updates old.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch import nn

from nobubble.rl.actor_learner.model import make_env

ENVS, FRAMES, EPOCHS, MINIBATCH, WORKERS = 8, 256, 10, 64, 2


def _one(delay_ms: float) -> Any:
    from torchrl.envs import GymWrapper

    return GymWrapper(make_env("CartPole-v1", delay_ms), categorical_action_encoding=True)


def _env(delay_ms: float, seed: int) -> Any:
    from torchrl.envs import RewardSum, SerialEnv, TransformedEnv

    env = TransformedEnv(SerialEnv(ENVS, functools.partial(_one, delay_ms)), RewardSum())
    env.set_seed(seed)
    return env


def _mlp(obs_dim: int, out: int, gain: float) -> nn.Sequential:
    """SB3's MlpPolicy net: 64x64 tanh, orthogonal init (sqrt 2 hidden, ``gain`` output)."""
    net = nn.Sequential(nn.Linear(obs_dim, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(),
                        nn.Linear(64, out))  # fmt: skip
    layers = [m for m in net if isinstance(m, nn.Linear)]
    for layer, g in zip(layers, (2**0.5, 2**0.5, gain), strict=True):
        nn.init.orthogonal_(layer.weight, g)
        nn.init.zeros_(layer.bias)
    return net


def run_torchrl(
    delay_ms: float,
    seed: int,
    max_seconds: float,
    *,
    asynchronous: bool,
    greedy_eval: Callable[[Callable[[np.ndarray], np.ndarray], int], float],
    target: float = 475.0,
    eval_every_s: float = 5.0,
) -> dict[str, Any]:
    """Train until ``greedy_eval`` reaches ``target`` or ``max_seconds`` pass; the record
    ``run_sb3`` returns. Same eval rule as SB3's: after each batch, every ``eval_every_s``,
    or a fifth of that when the mean of the last 20 training episodes reaches the target."""
    from tensordict.nn import TensorDictModule
    from torchrl.collectors import Collector, MultiAsyncCollector
    from torchrl.data import LazyTensorStorage, ReplayBuffer, SamplerWithoutReplacement
    from torchrl.modules import ProbabilisticActor, ValueOperator
    from torchrl.objectives import ClipPPOLoss
    from torchrl.objectives.value import GAE

    torch.set_num_threads(1)
    torch.manual_seed(seed)
    start = time.monotonic()
    probe = _one(0.0)  # not a SerialEnv: closing one resets torch's thread count
    obs_dim = probe.observation_spec["observation"].shape[-1]
    actions = probe.action_spec
    probe.close()
    logits = _mlp(obs_dim, int(actions.space.n), 0.01)
    actor = ProbabilisticActor(
        TensorDictModule(logits, in_keys=["observation"], out_keys=["logits"]),
        in_keys=["logits"], distribution_class=torch.distributions.Categorical,
        spec=actions, return_log_prob=True,
    )  # fmt: skip
    critic = ValueOperator(_mlp(obs_dim, 1, 1.0), in_keys=["observation"])
    advantage = GAE(gamma=0.99, lmbda=0.95, value_network=critic, average_gae=False)
    loss_fn = ClipPPOLoss(
        actor, critic, clip_epsilon=0.2, entropy_bonus=False, critic_coeff=0.5,
        loss_critic_type="l2", normalize_advantage=True,
    )  # fmt: skip
    optim = torch.optim.Adam(loss_fn.parameters(), lr=3e-4, eps=1e-5)
    buffer = ReplayBuffer(
        storage=LazyTensorStorage(FRAMES), sampler=SamplerWithoutReplacement(),
        batch_size=MINIBATCH,
    )  # fmt: skip
    collector: Any
    if asynchronous:
        makers = [functools.partial(_env, delay_ms, seed + 1000 * i) for i in range(WORKERS)]
        collector = MultiAsyncCollector(
            makers, actor, frames_per_batch=FRAMES, total_frames=-1, num_threads=1,
            auto_register_policy_transforms=False,
        )  # fmt: skip
    else:
        collector = Collector(_env(delay_ms, seed), actor, frames_per_batch=FRAMES,
                              total_frames=-1, auto_register_policy_transforms=False)  # fmt: skip
    torch.set_num_threads(1)  # torchrl's batched envs and collectors set their own counts

    def predict(obs: np.ndarray) -> np.ndarray:
        with torch.no_grad():
            return logits(torch.as_tensor(obs, dtype=torch.float32)).argmax(-1).numpy()

    episodes: list[float] = []
    frames, last_eval, hit, score = 0, start, None, 0.0
    try:
        for batch in collector:
            frames += batch.numel()
            done = batch["next", "done"]
            episodes += batch["next", "episode_reward"][done].tolist()
            now = time.monotonic()
            hot = len(episodes) >= 20 and np.mean(episodes[-20:]) >= target
            since = now - last_eval
            if since >= eval_every_s or (hot and since >= eval_every_s / 5):
                score, last_eval = greedy_eval(predict, seed), time.monotonic()
                if score >= target:
                    hit = (last_eval - start, frames)
                    break
            if now - start >= max_seconds:
                break
            with torch.no_grad():
                advantage(batch)
            buffer.empty()
            buffer.extend(batch.reshape(-1))
            for _ in range(EPOCHS * FRAMES // MINIBATCH):
                losses = loss_fn(buffer.sample())
                loss = losses["loss_objective"] + losses["loss_critic"]
                optim.zero_grad()
                loss.backward()
                nn.utils.clip_grad_norm_(loss_fn.parameters(), 0.5)
                optim.step()
            collector.update_policy_weights_()
    finally:
        collector.shutdown()
    wall = time.monotonic() - start
    return {
        "time_to_475_s": hit[0] if hit else None, "steps_to_475": hit[1] if hit else None,
        "env_steps_per_s": frames / wall, "eval_mean_return": score, "wall_s": wall,
        "env_steps": frames,
    }  # fmt: skip
