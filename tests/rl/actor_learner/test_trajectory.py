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
