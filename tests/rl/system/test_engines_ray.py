"""The Ray engine: the same short end-to-end run as the local engine, on the test run's one
local Ray instance (``ray_session`` in tests/conftest.py: Ray starts slowly)."""

from __future__ import annotations

import pytest
import ray  # the [ray] extra, installed by `make install`

from nobubble.rl.system.engines.ray import RayEngine
from nobubble.rl.system.orchestrator import Orchestrator, RunConfig, WorkerError, run

TINY = dict(
    engine="ray",
    batch_groups=3,
    group_size=4,
    eval_every=2,
    policy_kwargs={"hidden": 32},
    timeout_s=240,
    stall_timeout_s=90,
)


def test_ray_engine_end_to_end(ray_session):
    cfg = RunConfig(mode="fully-async", max_staleness=2, steps=4, groups_per_rollout=1, **TINY)
    engine, sent = RayEngine(), []  # after each step: who the engine has sent weights to
    res = Orchestrator(cfg, engine, on_step=lambda v, m: sent.append(set(engine._sent))).run()
    # the generator pulls the published weights; the one learner makes them, never pulls
    assert len(sent) == 4 and all(s == {"rollout-0"} for s in sent), sent
    assert res.steps == 4
    assert all(len(set(v)) == 1 for v in res.group_versions.values())
    assert res.staleness_max <= 2
    assert res.ledger.ok
    assert res.trained_samples == 4 * 3 * 4
    assert res.weight_versions == [0, 1, 2, 3, 4]
    assert {s.stage for s in res.spans} == {"rollout", "reward", "trainer"}
    assert ray.is_initialized()  # the engine leaves a Ray it did not start running


def test_ray_actor_failure_ends_the_run(ray_session):
    with pytest.raises(WorkerError, match="trainer failed.*InjectedFault"):
        run(RunConfig(mode="sync", steps=4, fault="trainer:2:raise", **TINY))


@pytest.mark.long  # the check is the orchestrator's, proven on the local engine in the fast tier
def test_ray_a_generator_sampling_with_stale_weights_is_caught(ray_session):
    """On Ray the weights travel through the object store; the digests are checked alike."""
    with pytest.raises(WorkerError, match="rollout-0 .*weights other than the version it"):
        run(RunConfig(mode="sync", steps=5, fault="rollout-0:2:stale", **TINY))
