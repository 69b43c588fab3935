"""One trajectory builder for every architecture: an impala actor's unroll and central
inference's message stream both equal a plain loop written out here."""

from __future__ import annotations

import gymnasium  # noqa: F401 - a hard dependency: a broken install fails here
import numpy as np
import torch

from nobubble.rl.actor_learner.model import ActorCritic, TrajectoryBuilder, act, rollout, vector_env


def _plain_unrolls(model: ActorCritic, T: int, K: int, num: int) -> list[dict]:
    """The reference: ``num`` unrolls of ``T`` steps of ``K`` CartPoles, step by step."""
    envs, gen = vector_env("CartPole-v1", K), torch.Generator().manual_seed(3)
    obs, out = envs.reset(seed=5)[0], []
    running = np.zeros(K)  # (K,) each env's return so far
    for _ in range(num):
        steps: dict[str, list] = {"obs": [obs], "actions": [], "behaviour_logits": [],
                                  "rewards": [], "dones": [], "episode_returns": []}  # fmt: skip
        for _ in range(T):
            actions, logits = act(model, obs, gen)
            obs, rewards, terminated, truncated, _ = envs.step(actions)
            dones = terminated | truncated
            for name, value in zip(steps, (obs, actions, logits, rewards, dones)):
                steps[name].append(value)
            running += rewards
            steps["episode_returns"].extend(float(running[k]) for k in np.flatnonzero(dones))
            running[dones] = 0.0
        out.append({k: tuple(v) if k == "episode_returns" else np.stack(v) for k, v in
                    steps.items()})  # fmt: skip
    return out


def test_the_builder_makes_the_plain_loops_trajectories_from_either_side() -> None:
    torch.manual_seed(0)
    model = ActorCritic(4, 2, 8)
    T, K = 12, 3
    expected = _plain_unrolls(model, T, K, 3)

    # an impala actor: rollout steps its own envs
    envs, gen = vector_env("CartPole-v1", K), torch.Generator().manual_seed(3)
    builder = TrajectoryBuilder("s", T)
    obs, _ = envs.reset(seed=5)
    builder.observe(obs)
    local = []
    for version in range(3):
        t, obs = rollout(model, envs, builder, obs, version=version, generator=gen)
        local.append(t)

    # the same env stream, seen as (obs, reward, done) messages answered by inference
    envs, gen = vector_env("CartPole-v1", K), torch.Generator().manual_seed(3)
    builder = TrajectoryBuilder("s", T)
    obs, reward, done = envs.reset(seed=5)[0], np.zeros(K, np.float32), np.zeros(K, bool)
    streamed = []
    for step in range(3 * T + 1):
        finished = builder.observe(obs, reward, done)
        if finished is not None:
            streamed.append(finished)
        actions, logits = act(model, obs, gen)
        builder.record(actions, logits, version=step // T)
        obs, reward, terminated, truncated, _ = envs.step(actions)
        done = terminated | truncated
    for got in (local, streamed):
        assert [t.seq for t in got] == [0, 1, 2] and [t.policy_version for t in got] == [0, 1, 2]
        assert [t.key for t in got] == [("s", 0), ("s", 1), ("s", 2)]
        assert [t.num_steps for t in got] == [T * K] * 3  # 36 env steps each
        for g, e in zip(got, expected):
            for name, want in e.items():
                np.testing.assert_array_equal(getattr(g, name), want, err_msg=name)
    assert sum(len(e["episode_returns"]) for e in expected) > 0


def test_the_learner_refuses_a_trajectory_whose_weights_are_not_its_version() -> None:
    """An actor that acted with weights other than the version it reports is named."""
    import dataclasses

    import pytest

    from nobubble.distributed import WorkerError
    from nobubble.rl.actor_learner.config import EnvRunConfig
    from nobubble.rl.actor_learner.run import _Run
    from nobubble.rl.system.weight_sync import weight_digest

    config = EnvRunConfig(actors=1, envs_per_actor=2, batch_trajectories=1, minibatches=1,
                          eval_episodes=2, unroll_length=4)  # fmt: skip
    torch.manual_seed(0)
    model = ActorCritic(4, 2, 8)
    run = _Run(config, model)
    gen, envs = torch.Generator().manual_seed(0), vector_env("CartPole-v1", 2)
    builder, obs = TrajectoryBuilder("actor-0", 4), envs.reset(seed=1)[0]
    builder.observe(obs)
    good, obs = rollout(model, envs, builder, obs, version=0, generator=gen,
                        digest=weight_digest(model))  # fmt: skip
    run.take([good])
    assert run.update_if_ready() and run.learner.version == 1  # the right digest trains
    other = ActorCritic(4, 2, 8)  # a policy that is not version 1
    bad, _ = rollout(other, envs, builder, obs, version=1, generator=gen,
                     digest=weight_digest(other))  # fmt: skip
    run.take([bad])
    with pytest.raises(WorkerError, match="actor-0 sampled with weights") as info:
        run.update_if_ready()
    assert info.value.worker == "actor-0"
    forged = dataclasses.replace(bad, seq=2, weight_digests=((9, "0" * 16),))
    run.take([forged])
    run.pending = [forged]
    with pytest.raises(WorkerError, match="claims version 9, never published"):
        run.update_if_ready()
