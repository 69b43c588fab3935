"""The actor-learner's actors under the one supervisor (:mod:`nobubble.distributed.supervisor`):
a SIGSTOPped actor is named by its missing heartbeat, the run ends with a
:class:`~nobubble.distributed.WorkerError` naming it, and no process is left running.

The fast tier stops an actor of an :class:`ActorPool` with a short ``liveness_s``; the long
tier stops one inside ``train`` with the default settings and checks the issue's bounds:
named within 45 s of the stop, ``train`` out within 10 s of that.
"""

from __future__ import annotations

import functools
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import gymnasium
import pytest

from nobubble.distributed import BEAT_S, LIVENESS_S, WorkerError
from nobubble.rl import EnvRunConfig, train
from nobubble.rl.actor_learner.launch import ActorPool
from nobubble.rl.actor_learner.model import build_model, env_spaces
from tests.support.wait import wait_for

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="SIGSTOP, /proc")

_ACTOR_1_SEED = 100  # the first env of actor-1 (seed 0): seed * 1000 + 100 * index


def _children() -> set[int]:
    """Pids of this process's live children, forked from any of its threads."""
    pids: set[int] = set()
    for task in Path(f"/proc/{os.getpid()}/task").iterdir():
        try:
            pids.update(int(p) for p in (task / "children").read_text().split())
        except OSError:  # the thread ended while we looked
            continue
    return pids


@pytest.mark.parametrize("arch", ["impala", "seed"])
def test_a_stopped_actor_of_the_pool_is_named_and_reaped(arch: str) -> None:
    before = _children()
    config = EnvRunConfig(arch=arch, actors=2, envs_per_actor=2, target_return=None)
    model = build_model(config, *env_spaces(config.env))
    pool = ActorPool(config, model, liveness_s=3.0)
    stopped = pool.procs[1]
    try:
        beats = pool.supervisor.beats
        wait_for(lambda: all(beats.slots[i] for i in beats.index.values()), timeout_s=60,
                 what="every actor beat once")  # fmt: skip
        os.kill(stopped.pid, signal.SIGSTOP)

        def named() -> WorkerError | None:
            pool.receive(0, poll_s=0.05)
            try:
                pool.supervise()
            except WorkerError as failure:
                return failure
            return None

        failure = wait_for(named, timeout_s=60, what="the stopped actor named")
        assert failure.worker == "actor-1"
        assert "actor-1 stopped responding: no heartbeat for" in str(failure)
    finally:
        pool.close()
    assert stopped.exitcode == -signal.SIGKILL  # it could not take SIGTERM while stopped
    assert not any(p.is_alive() for p in pool.procs)
    assert _children() <= before


class _StopsActor1(gymnasium.Wrapper):  # type: ignore[misc]
    """CartPole that, as actor-1's first env, writes ``pid monotonic-time`` to ``record``
    and stops its own process (SIGSTOP) on its 100th step."""

    def __init__(self, record: Path) -> None:
        super().__init__(gymnasium.make("CartPole-v1"))
        self.record, self.steps, self.first_seed = record, 0, None

    def reset(self, *, seed: int | None = None, options: Any = None) -> Any:
        if self.first_seed is None:
            self.first_seed = seed
        return super().reset(seed=seed, options=options)

    def step(self, action: Any) -> Any:
        self.steps += 1
        if self.steps == 100 and self.first_seed == _ACTOR_1_SEED:
            self.record.write_text(f"{os.getpid()} {time.monotonic()}")
            os.kill(os.getpid(), signal.SIGSTOP)
        return super().step(action)


@pytest.mark.long  # the default liveness (30 s) on a real run
@pytest.mark.parametrize("arch", ["impala", "seed"])
def test_a_stopped_actor_ends_train_within_the_bounds(
    arch: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Named within 45 s of its SIGSTOP (default liveness), ``train`` out within 10 s of
    that, nothing left running."""
    record = tmp_path / "stopped"
    named_at: list[float] = []
    supervise = ActorPool.supervise

    def timed_supervise(pool: ActorPool) -> None:  # a spy: notes when the failure is raised
        try:
            supervise(pool)
        except WorkerError:
            named_at.append(time.monotonic())
            raise

    monkeypatch.setattr(ActorPool, "supervise", timed_supervise)
    before = _children()
    config = EnvRunConfig(
        env=functools.partial(_StopsActor1, record), arch=arch, actors=2, envs_per_actor=2,
        target_return=None, time_budget_s=300.0,
    )  # fmt: skip
    with pytest.raises(WorkerError) as info:
        train(config)
    out_at = time.monotonic()
    pid, stopped_at = record.read_text().split()
    assert info.value.worker == "actor-1" and "stopped responding" in str(info.value)
    assert len(named_at) == 1
    named_s, exit_s = named_at[0] - float(stopped_at), out_at - named_at[0]
    print(f"{arch}: named {named_s:.1f}s after the stop, train out {exit_s:.1f}s after that")
    assert LIVENESS_S - BEAT_S <= named_s < 45.0  # its last beat came up to BEAT_S before
    assert exit_s < 10.0
    assert not Path(f"/proc/{pid}").exists()  # killed and reaped
    assert _children() <= before
