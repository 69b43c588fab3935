"""The environment producer's update through the one Learner: ``epochs x minibatches`` Adam
steps on V-trace / APPO, one new version, against a plain loop written out here."""

from __future__ import annotations

import copy

import gymnasium  # noqa: F401 - a hard dependency: a broken install fails here
import torch

from nobubble.rl.actor_learner.config import EnvRunConfig
from nobubble.rl.actor_learner.model import (
    ActorCritic,
    TrajectoryBuilder,
    rollout,
    stack_trajectories,
    vector_env,
)
from nobubble.rl.actor_learner.run import VTraceLoss, env_learner, minibatches


def test_an_update_is_one_version_of_epochs_times_minibatches_adam_steps() -> None:
    cfg = EnvRunConfig(env="CartPole-v1", epochs=3, minibatches=2, seed=4)
    torch.manual_seed(0)
    model = ActorCritic(4, 2, 8)
    envs = vector_env("CartPole-v1", 4)
    gen = torch.Generator().manual_seed(0)
    builder, obs = TrajectoryBuilder("s", 8), envs.reset(seed=1)[0]
    builder.observe(obs)
    traj, _ = rollout(model, envs, builder, obs, version=0, generator=gen)
    batch = stack_trajectories([traj])
    initial = copy.deepcopy(model)

    learner = env_learner(model, cfg)
    shard = learner.update(minibatches(batch, cfg, torch.Generator().manual_seed(cfg.seed)))
    assert learner.version == 1  # one version per update, however many steps
    assert {int(s["step"]) for s in learner.optimizer.state.values()} == {6}
    assert set(shard.metrics) == {"policy_loss", "value_loss", "entropy", "clip_fraction"}

    # the reference: the same minibatches, zero_grad / backward / clip / Adam(eps=1e-5) each
    ref = copy.deepcopy(initial)
    opt = torch.optim.Adam(ref.parameters(), lr=cfg.lr, eps=1e-5)
    loss_fn = VTraceLoss(cfg)
    for mb in minibatches(batch, cfg, torch.Generator().manual_seed(cfg.seed)):
        loss, _ = loss_fn(ref, mb, 0)
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(ref.parameters(), cfg.max_grad_norm)
        opt.step()
    moved = False
    for name, want in ref.state_dict().items():
        assert torch.equal(model.state_dict()[name], want), name
        moved |= not torch.equal(initial.state_dict()[name], want)
    assert moved
