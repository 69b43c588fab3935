"""An impala actor acts with its own copy of the policy, whatever the start method: under
``spawn``/``forkserver`` a model passed to a process arrives in shared memory, and an actor
loading a version into it would overwrite the learner's parameters."""

from __future__ import annotations

import torch

from nobubble.rl import EnvRunConfig
from nobubble.rl.actor_learner.launch import ActorPool
from nobubble.rl.actor_learner.model import build_model, env_spaces
from tests.support.wait import wait_for


def test_an_actor_pulling_a_version_leaves_the_learners_parameters_alone() -> None:
    # forkserver (as spawn) hands the model over in shared memory; fork copies it anyway
    config = EnvRunConfig(arch="impala", actors=1, envs_per_actor=2, unroll_length=4,
                          target_return=None, start_method="forkserver")  # fmt: skip
    model = build_model(config, *env_spaces(config.env))
    params = list(model.parameters())  # type: ignore[attr-defined]
    pool = ActorPool(config, model)
    try:
        wait_for(lambda: bool(pool.receive(0, poll_s=0.1)), timeout_s=60, what="a trajectory")
        with torch.no_grad():  # version 1 = ones, then the learner moves on to twos in place
            for p in params:
                p.fill_(1.0)
            pool.publish(1)
            for p in params:
                p.fill_(2.0)
        seen: list[int] = []

        def pulled_one() -> bool:
            seen.extend(t.policy_version for t in pool.receive(1, poll_s=0.1))
            return 1 in seen

        wait_for(pulled_one, timeout_s=60, what="a trajectory of version 1")
        assert all(bool((p == 2.0).all()) for p in params)
    finally:
        pool.close()
