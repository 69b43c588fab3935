"""Central inference's trajectory builder makes the same trajectory as a local rollout."""

from __future__ import annotations

import gymnasium  # noqa: F401 - a hard dependency: a broken install fails here
import numpy as np
import torch

from nobubble.rl.actor_learner.envs import VectorEnv
from nobubble.rl.actor_learner.model import ActorCritic, act
from nobubble.rl.actor_learner.rollout import rollout
from nobubble.rl.actor_learner.trajectory import TrajectoryBuilder


def test_builder_from_the_message_stream_equals_the_local_rollout() -> None:
    torch.manual_seed(0)
    model = ActorCritic(4, 2, 8)
    T, K = 12, 3
    local_envs = VectorEnv("CartPole-v1", K, seed=5)
    obs = local_envs.reset()
    expected = []
    gen = torch.Generator().manual_seed(3)
    for seq in range(3):
        t, obs = rollout(model, local_envs, obs, T, version=seq, generator=gen, source="s", seq=seq)
        expected.append(t)

    # the same env stream, seen as (obs, reward, done) messages answered by inference
    envs, gen = VectorEnv("CartPole-v1", K, seed=5), torch.Generator().manual_seed(3)
    builder = TrajectoryBuilder("s", T, K, 4, 2)
    obs, reward, done = envs.reset(), np.zeros(K, np.float32), np.zeros(K, bool)
    got = []
    for step in range(3 * T + 1):
        finished = builder.observe(obs, reward, done)
        if finished is not None:
            got.append(finished)
        actions, logits = act(model, obs, gen)
        builder.record(actions, logits, version=step // T)
        out = envs.step(actions)
        obs, reward, done = out.obs, out.rewards, out.dones
    assert [t.seq for t in got] == [0, 1, 2]
    for g, e in zip(got, expected):
        assert g.policy_version == e.policy_version
        for name in ("obs", "actions", "behaviour_logits", "rewards", "dones"):
            np.testing.assert_array_equal(getattr(g, name), getattr(e, name), err_msg=name)
        assert g.episode_returns == e.episode_returns
    assert sum(len(t.episode_returns) for t in got) > 0


def test_the_learner_refuses_a_trajectory_whose_weights_are_not_its_version() -> None:
    """An actor that acted with weights other than the version it reports is named."""
    import dataclasses

    import pytest

    from nobubble.rl.actor_learner.config import EnvRunConfig
    from nobubble.rl.actor_learner.run import _Run
    from nobubble.rl.system.engines.protocol import ActorFailure
    from nobubble.rl.system.weight_sync import weight_digest

    config = EnvRunConfig(actors=1, envs_per_actor=2, batch_trajectories=1, minibatches=1,
                          eval_episodes=2, unroll_length=4)  # fmt: skip
    torch.manual_seed(0)
    model = ActorCritic(4, 2, 8)
    run = _Run(config, model)
    gen, envs = torch.Generator().manual_seed(0), VectorEnv("CartPole-v1", 2, seed=1)
    good, obs = rollout(model, envs, envs.reset(), 4, version=0, generator=gen,
                        source="actor-0", seq=0, digest=weight_digest(model))  # fmt: skip
    run.take([good])
    assert run.update_if_ready() and run.learner.version == 1  # the right digest trains
    other = ActorCritic(4, 2, 8)  # a policy that is not version 1
    bad, _ = rollout(other, envs, obs, 4, version=1, generator=gen, source="actor-0", seq=1,
                     digest=weight_digest(other))  # fmt: skip
    run.take([bad])
    with pytest.raises(ActorFailure, match="actor actor-0 failed: actor-0 sampled with weights"):
        run.update_if_ready()
    forged = dataclasses.replace(bad, seq=2, weight_digests=((9, "0" * 16),))
    run.take([forged])
    run.pending = [forged]
    with pytest.raises(ActorFailure, match="claims version 9, never published"):
        run.update_if_ready()
