"""The one supervisor's heartbeats (spawn's ranks, the RL local engine's workers, the
actor-learner's actors): a beating process is not reported, a stopped one is, by name, once
it has been silent for ``liveness_s``; :func:`reap` ends a stopped one.

The rule is checked on a hand-stepped clock (no wall-clock time); the long tier also stops a
real worker with SIGSTOP and times how soon it is named.
"""

from __future__ import annotations

import os
import signal
import sys
import time

import pytest

from nobubble.distributed import (
    BEAT_S,
    STARTUP_S,
    Heartbeats,
    reap,
    start_beating,
    worker_context,
)
from tests.support.wait import wait_for


class _Clock:
    """A clock that moves only when the test says so."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_silence_is_named_exactly_after_liveness_on_a_stepped_clock() -> None:
    clock = _Clock()
    beats = Heartbeats(worker_context(), ["rollout-0", "trainer"], liveness_s=2.5, clock=clock)
    slots = {name: beats.started(name) for name in ("rollout-0", "trainer")}
    names = list(slots)
    for _ in range(10):  # both beat every BEAT_S: never reported, however long it runs
        for i in slots.values():
            beats.slots[i] = clock.now
        clock.now += BEAT_S
        assert beats.silent(names) is None
    last = clock.now - BEAT_S
    beats.slots[slots["rollout-0"]] = clock.now  # rollout-0 beats on; trainer stops
    clock.now = last + 2.5  # silent for exactly liveness_s: not yet
    beats.slots[slots["rollout-0"]] = clock.now
    assert beats.silent(names) is None
    clock.now = last + 2.5 + 1e-6
    beats.slots[slots["rollout-0"]] = clock.now
    assert beats.silent(names) == ("trainer", pytest.approx(2.5 + 1e-6))


def test_a_restarted_worker_gets_the_startup_grace_again() -> None:
    clock = _Clock()
    beats = Heartbeats(worker_context(), ["reward-0"], liveness_s=2.5, clock=clock)
    beats.slots[beats.started("reward-0")] = clock.now
    clock.now += 3.0
    assert beats.silent(["reward-0"]) == ("reward-0", pytest.approx(3.0))
    beats.started("reward-0")  # restarted: its slot is cleared, it has not beaten yet
    clock.now += STARTUP_S
    assert beats.silent(["reward-0"]) is None  # within the grace
    clock.now += 0.5
    assert beats.silent(["reward-0"]) == ("reward-0", pytest.approx(STARTUP_S + 0.5))


def test_no_liveness_never_reports() -> None:
    clock = _Clock()
    beats = Heartbeats(worker_context(), ["a"], liveness_s=None, clock=clock)
    beats.started("a")
    clock.now += 1e9
    assert beats.silent(["a"]) is None


def _beat_then_wait(slots, index: int) -> None:
    start_beating(slots, index)
    time.sleep(60)  # "working" until stopped and killed


@pytest.mark.long
@pytest.mark.skipif(sys.platform != "linux", reason="SIGSTOP")
def test_a_stopped_worker_is_named_after_its_liveness() -> None:
    ctx = worker_context()
    beats = Heartbeats(ctx, ["rollout-0", "trainer"], liveness_s=2.5)
    procs = {n: ctx.Process(target=_beat_then_wait, args=(beats.slots, beats.started(n)),
                            daemon=True) for n in ("rollout-0", "trainer")}  # fmt: skip
    for p in procs.values():
        p.start()
    try:
        wait_for(lambda: all(beats.slots[i] for i in beats.index.values()), timeout_s=300,
                 what="both workers beat once")  # fmt: skip
        time.sleep(3.0)  # longer than liveness_s: beating workers are not reported
        assert beats.silent(list(procs)) is None
        os.kill(procs["trainer"].pid, signal.SIGSTOP)
        stopped = time.monotonic()
        while (silent := beats.silent(list(procs))) is None:
            assert time.monotonic() - stopped < 10, "the stopped worker was never named"
            time.sleep(0.1)
        name, since = silent
        assert name == "trainer" and since > 2.5
        assert time.monotonic() - stopped < 2.5 + 2 * 1.0 + 1.0  # liveness + a beat or two
    finally:
        for p in procs.values():
            p.kill()
            p.join(timeout=5)


def test_a_worker_that_never_beat_gets_the_startup_grace() -> None:
    beats = Heartbeats(worker_context(), ["reward-0"], liveness_s=2.5)
    beats.started("reward-0")
    assert beats.silent(["reward-0"]) is None  # no beat yet, but within the startup grace


@pytest.mark.parametrize("liveness_s", [0.0, 2.0, -1.0])
def test_a_liveness_too_short_for_the_beat_is_refused(liveness_s: float) -> None:
    with pytest.raises(ValueError, match=f"liveness_s={liveness_s}"):
        Heartbeats(worker_context(), ["a"], liveness_s=liveness_s)


def test_the_hung_message_names_the_process_and_its_silence() -> None:
    clock = _Clock()
    beats = Heartbeats(worker_context(), ["actor-0", "actor-1"], liveness_s=30.0, clock=clock)
    for name in ("actor-0", "actor-1"):
        beats.slots[beats.started(name)] = clock.now
    clock.now += 30.0
    assert beats.hung(["actor-0", "actor-1"]) is None
    beats.slots[beats.index["actor-0"]] = clock.now  # actor-0 beats on, actor-1 does not
    clock.now += 1.0
    name, message = beats.hung(["actor-0", "actor-1"]) or ("", "")
    assert name == "actor-1"
    assert message.startswith("actor-1 stopped responding: no heartbeat for 31s (liveness_s=30)")


def _sleep_exiting_3_on_sigterm(seconds: float) -> None:
    signal.signal(signal.SIGTERM, lambda *_: os._exit(3))  # like a rank: a Python handler
    time.sleep(seconds)


def _state(pid: int | None) -> str:
    return open(f"/proc/{pid}/stat").read().rpartition(")")[2].split()[0]


@pytest.mark.skipif(sys.platform != "linux", reason="SIGSTOP, /proc")
def test_reap_kills_a_stopped_process_and_terminates_a_running_one() -> None:
    """A stopped process cannot run its SIGTERM handler until continued: reap SIGKILLs it at
    once; a running one gets SIGTERM (its handler exits 3). Nothing is left alive."""
    ctx = worker_context()
    procs = [ctx.Process(target=_sleep_exiting_3_on_sigterm, args=(120,), daemon=True)
             for _ in range(2)]  # fmt: skip
    for p in procs:
        p.start()
    stopped, running = procs
    try:
        os.kill(stopped.pid, signal.SIGSTOP)
        wait_for(lambda: _state(stopped.pid) == "T", timeout_s=60, what="the process stopped")
        reap(procs, grace_s=0.0, term_s=60.0)
        assert not stopped.is_alive() and stopped.exitcode == -signal.SIGKILL
        # 3 from its handler, or -SIGTERM if the signal came before the handler was set
        assert not running.is_alive() and running.exitcode in (3, -signal.SIGTERM)
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
