"""The learner's V-trace targets on recorded CartPole trajectories equal a plain reference.

The trajectories come from a real rollout (an actor's policy) and are re-scored by another
policy (the learner's), so the importance ratios are not 1 and episodes end inside the
unroll. The reference is the paper's sum (Espeholt et al., 2018, eq. 1), element by
element in Python floats, not the library's backward recursion.
"""

from __future__ import annotations

import math

import gymnasium  # noqa: F401 - a hard dependency: a broken install fails here
import pytest
import torch

from nobubble.rl.actor_learner.model import (
    ActorCritic,
    TrajectoryBuilder,
    rollout,
    stack_trajectories,
    vector_env,
)
from nobubble.rl.actor_learner.run import vtrace_targets


def _reference(rhos, discounts, rewards, values, bootstrap, lam):  # type: ignore[no-untyped-def]
    """vs_t and A_t by the paper's sums; all arguments nested lists [T][B] of floats."""
    T, B = len(rewards), len(rewards[0])
    vs = [[0.0] * B for _ in range(T)]
    adv = [[0.0] * B for _ in range(T)]
    for b in range(B):
        v = [values[t][b] for t in range(T)] + [bootstrap[b]]
        for t in range(T):
            total, trace = 0.0, 1.0
            for s in range(t, T):
                delta = min(1.0, rhos[s][b]) * (rewards[s][b] + discounts[s][b] * v[s + 1] - v[s])
                total += trace * delta
                trace *= discounts[s][b] * lam * min(1.0, rhos[s][b])
            vs[t][b] = v[t] + total
        for t in range(T):
            vs_next = vs[t + 1][b] if t + 1 < T else bootstrap[b]
            q = rewards[t][b] + discounts[t][b] * (lam * vs_next + (1 - lam) * v[t + 1])
            adv[t][b] = min(1.0, rhos[t][b]) * (q - v[t])
    return vs, adv


@pytest.mark.parametrize("lam", [1.0, 0.9])
def test_vtrace_targets_equal_the_papers_sums_on_recorded_trajectories(lam: float) -> None:
    torch.manual_seed(0)
    actor, learner = ActorCritic(4, 2, 16), ActorCritic(4, 2, 16)
    with torch.no_grad():
        for p in learner.parameters():  # a policy that differs from the actor's
            p.add_(0.5 * torch.randn_like(p))
    envs = vector_env("CartPole-v1", num_envs=3)
    obs, gen = envs.reset(seed=1)[0], torch.Generator().manual_seed(0)
    builder = TrajectoryBuilder("a", 40)
    builder.observe(obs)
    trajectories = []
    for _ in range(2):
        t, obs = rollout(actor, envs, builder, obs, version=0, generator=gen)
        trajectories.append(t)
    batch = stack_trajectories(trajectories)  # (T, B) = (40, 6)
    assert batch.dones.sum() > 0, "episodes should end inside the unroll"
    gamma = 0.97
    got = vtrace_targets(*learner(batch.obs), batch, gamma, lam)

    with torch.no_grad():
        logits, values = learner(batch.obs.double().float())  # (T + 1, B, A), (T + 1, B)
    logp = torch.log_softmax(logits[:-1].double(), -1)
    mu = torch.log_softmax(batch.behaviour_logits.double(), -1)
    a = batch.actions.unsqueeze(-1)
    rhos = torch.exp(logp.gather(-1, a) - mu.gather(-1, a)).squeeze(-1)  # (T, B)
    discounts = gamma * (1.0 - batch.dones.double())
    vs, adv = _reference(
        rhos.tolist(), discounts.tolist(), batch.rewards.double().tolist(),
        values[:-1].double().tolist(), values[-1].double().tolist(), lam,
    )  # fmt: skip
    assert not math.isclose(rhos.min().item(), 1.0), "ratios should differ from 1"
    torch.testing.assert_close(
        got.vs.double(), torch.tensor(vs, dtype=torch.float64), atol=1e-4, rtol=1e-4
    )
    torch.testing.assert_close(
        got.pg_advantages.double(), torch.tensor(adv, dtype=torch.float64), atol=1e-4, rtol=1e-4
    )
