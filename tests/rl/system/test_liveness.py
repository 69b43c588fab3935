"""The local engine's heartbeats: a beating worker is not reported, a stopped one is, by name,
once it has been silent for ``liveness_s``.

The rule is checked on a hand-stepped clock (no wall-clock time); the long tier also stops a
real worker with SIGSTOP and times how soon it is named.
"""

from __future__ import annotations

import os
import signal
import sys
import time

import pytest

from nobubble.distributed import STARTUP_S, worker_context
from nobubble.rl.system.engines.liveness import BEAT_S, Heartbeats, start_beating
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
