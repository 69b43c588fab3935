"""Worker restart and remote rewards inside a real run (local engine, real processes).

- a rollout worker SIGKILLed mid-run is restarted with ``restart_workers``; the run
  finishes and the ledger shows the requeued group and one fate per sample;
- a remote reward service started here on 127.0.0.1 scores a run; one that answers 500
  leads to retries, then to failures in the ledger - never to a silent score.
"""

from __future__ import annotations

import pytest

from nobubble.rl.system.config import RewardConfig, RunConfig
from nobubble.rl.system.orchestrator import WorkerError, run
from nobubble.rl.system.rewards import RewardServer
from nobubble.rl.system.tasks import DigitsTask

pytestmark = pytest.mark.timeout(300)

TINY = dict(batch_groups=2, group_size=4, eval_every=5, policy_kwargs={"hidden": 16}, timeout_s=240)


def test_killed_rollout_worker_is_restarted_and_its_group_requeued():
    cfg = RunConfig(
        mode="fully-async", steps=6, restart_workers=True, fault="rollout-0:3:kill", **TINY
    )
    res = run(cfg)
    assert res.steps == 6 and res.ledger.ok
    assert len(res.restarts) == 1 and res.restarts[0].startswith("rollout-0")
    requeued = [g for g, why in res.requeues if why == "worker_died"]
    assert requeued  # the group the dead worker held
    for gid in requeued:  # generated again under its own ids, and given one fate
        ids = [gid * cfg.group_size + i for i in range(cfg.group_size)]
        assert all(sid in res.fates for sid in ids)
    assert res.ledger.requeued == len(res.requeues)


def test_without_the_flag_a_dead_worker_stops_the_run():
    cfg = RunConfig(mode="fully-async", steps=6, fault="rollout-0:3:kill", **TINY)
    with pytest.raises(WorkerError, match="rollout-0 died"):
        run(cfg)


def test_remote_reward_service_scores_the_run():
    task = DigitsTask()
    with RewardServer(task.reward) as server:
        res = run(RunConfig(mode="sync", steps=3, reward_url=server.url, **TINY))
        served = server.requests
    assert res.ledger.ok and res.ledger.trained == 3 * 2 * 4
    assert served >= 3 * 2  # one batched request per group


def test_remote_reward_failures_are_retried_then_recorded():
    with RewardServer(DigitsTask().reward, fail_status=500) as server:
        cfg = RunConfig(
            mode="sync", steps=3, reward_url=server.url, time_budget_s=3.0,
            reward=RewardConfig(max_retries=2, give_up_groups=100), **TINY,
        )  # fmt: skip
        res = run(cfg)
        served = server.requests
    assert res.ledger.trained == 0 and res.steps == 0  # no made-up score was trained on
    failed_groups = res.ledger.dropped["reward_failed"] // 4
    assert failed_groups >= 2
    assert served >= failed_groups * 3  # 1 + 2 retries per group
    assert res.ledger.ok
