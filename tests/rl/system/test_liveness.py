"""The local engine's heartbeats: a beating worker is not reported, a stopped one is, by name,
once it has been silent for ``liveness_s``."""

from __future__ import annotations

import os
import signal
import sys
import time

import pytest

from nobubble.distributed import worker_context
from nobubble.rl.system.engines.liveness import Heartbeats, start_beating


def _beat_then_wait(slots, index: int) -> None:
    start_beating(slots, index)
    time.sleep(60)  # "working" until stopped and killed


@pytest.mark.skipif(sys.platform != "linux", reason="SIGSTOP")
def test_a_stopped_worker_is_named_after_its_liveness() -> None:
    ctx = worker_context()
    beats = Heartbeats(ctx, ["rollout-0", "trainer"], liveness_s=2.5)
    procs = {n: ctx.Process(target=_beat_then_wait, args=(beats.slots, beats.started(n)),
                            daemon=True) for n in ("rollout-0", "trainer")}  # fmt: skip
    for p in procs.values():
        p.start()
    try:
        deadline = time.monotonic() + 60
        while not all(beats.slots[i] for i in beats.index.values()):  # both beat once
            assert time.monotonic() < deadline, "the workers never beat"
            time.sleep(0.05)
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
