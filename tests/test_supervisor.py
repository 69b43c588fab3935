"""The one supervisor (:mod:`nobubble.distributed.supervisor`) on real processes: a worker's
own error is named before a peer's reaction to it, whichever arrives first; a worker killed
in silence is named by its exit code before a peer's reaction; a worker that reported and
exited 1 is named for its report, not for its exit; one that left with exit code 0 is not a
failure (the others speak for it).

Each child runs under :func:`supervised` and reports through its own pipe, as spawn's ranks do.
"""

from __future__ import annotations

import os
import signal
import time
from multiprocessing.connection import wait
from typing import Any

import pytest

from nobubble.distributed import Supervisor, WorkerError, supervised, worker_context


def _child(ward: Any, conn: Any, how: str, delay_s: float) -> None:
    supervised(ward, conn.send, _body, how, delay_s)


def _body(how: str, delay_s: float) -> None:
    time.sleep(delay_s)
    if how == "own":
        raise RuntimeError("boom: its own error")
    if how == "symptom":
        raise RuntimeError("[pair.cc:534] Connection closed by peer")
    if how == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if how == "wait":
        time.sleep(60)
    # "finish": return normally


class _Run:
    """Children ``name -> (how, delay_s)`` under one Supervisor; ``receive`` reads their pipes."""

    def __init__(self, plan: dict[str, tuple[str, float]]) -> None:
        ctx = worker_context()
        self.supervisor = Supervisor(ctx, list(plan), liveness_s=None, grace_s=30.0)
        self.conns: dict[str, Any] = {}
        for name, (how, delay_s) in plan.items():
            mine, theirs = ctx.Pipe(duplex=False)
            proc = ctx.Process(target=_child, args=(self.supervisor.ward(name), theirs, how,
                                                    delay_s), daemon=True)  # fmt: skip
            proc.start()
            theirs.close()
            self.conns[name], self.supervisor.procs[name] = mine, proc

    def receive(self, timeout_s: float) -> dict[str, str]:
        out: dict[str, str] = {}
        for conn in wait(list(self.conns.values()), timeout=timeout_s):
            name = next(n for n, c in self.conns.items() if c is conn)
            try:
                while conn.poll():
                    out[name] = conn.recv()
            except EOFError:
                del self.conns[name]
        return out

    def first_failure(self, timeout_s: float = 120.0) -> WorkerError:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            failure = self.supervisor.failure(self.receive)
            if failure is not None:
                return failure
            self.supervisor.hear(self.receive(0.1))
        pytest.fail("no failure named")

    def close(self) -> None:
        for p in self.supervisor.procs.values():
            p.kill()
            p.join(timeout=10)


@pytest.mark.parametrize("symptom_first", [True, False])
def test_a_workers_own_error_is_named_before_a_peers_connection_reset(symptom_first) -> None:
    run = _Run({"rank 0": ("symptom", 0.0 if symptom_first else 1.5),
                "rank 1": ("own", 1.5 if symptom_first else 0.0)})  # fmt: skip
    try:
        failure = run.first_failure()
    finally:
        run.close()
    assert failure.worker == "rank 1"
    assert str(failure) == "rank 1 failed: RuntimeError: boom: its own error"
    assert "Traceback" in failure.remote_traceback


def test_a_worker_killed_in_silence_is_named_before_a_peers_reaction() -> None:
    run = _Run({"trainer": ("symptom", 1.0), "trainer-1": ("kill", 0.0)})
    try:
        failure = run.first_failure()
    finally:
        run.close()
    assert failure.worker == "trainer-1"
    assert str(failure) == "trainer-1 died with exit code -9 before reporting"


def test_a_reported_error_is_named_for_its_report_not_its_exit() -> None:
    run = _Run({"actor-0": ("own", 0.0), "actor-1": ("wait", 0.0)})
    try:
        proc = run.supervisor.procs["actor-0"]
        proc.join(timeout=120)
        assert proc.exitcode == 1  # it reported, then exited 1
        failure = run.first_failure()  # its report is still in the pipe: heard at once
        assert failure.worker == "actor-0" and "boom: its own error" in str(failure)
        assert run.supervisor.failure(run.receive) is None  # named once; actor-1 runs on
    finally:
        run.close()


def test_a_worker_that_finished_or_left_with_exit_code_0_is_not_a_failure() -> None:
    run = _Run({"rank 0": ("finish", 0.0), "rank 1": ("wait", 0.0)})
    try:
        proc = run.supervisor.procs["rank 0"]
        proc.join(timeout=120)
        assert proc.exitcode == 0
        assert run.supervisor.failure(run.receive) is None  # rank 1 may still speak for it
        run.supervisor.procs["rank 1"].kill()
        run.supervisor.procs["rank 1"].join(timeout=60)
        failure = run.supervisor.failure(run.receive)
        assert (
            failure is not None and str(failure) == "rank 1 died with exit code -9 before reporting"
        )
    finally:
        run.close()
