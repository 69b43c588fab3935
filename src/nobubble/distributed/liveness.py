"""The one supervisor's (:mod:`nobubble.distributed.supervisor`) heartbeats in shared slots,
and a shutdown that leaves nothing running.

Heartbeats: one shared slot of time per process, no lock. A process's daemon thread
(:func:`start_beating`) writes ``time.monotonic()`` (one clock for every process of the
machine) into its slot every :data:`BEAT_S`; the launcher reads the slots whenever it polls
(:meth:`Heartbeats.hung`). A process that is stopped (SIGSTOP), swapping, or wedged holding
the interpreter stops writing, and after ``liveness_s`` (default :data:`LIVENESS_S`) it is
named. A plain shared array rather than a message on a pipe or queue: a process stopped
while it holds a queue's lock would stall every other writer of that queue with it, and a
slot needs no reader to drain it.

Users: :func:`~nobubble.distributed.spawn`'s ranks, the RL local engine's stage workers and
the actor-learner's actors and env workers.

Shutdown (:func:`reap`): after the caller's stop signal, a grace period, then SIGTERM, then
SIGKILL. A stopped process holds SIGTERM until it is continued, so it is killed at once -
a run with a stopped process still ends within seconds, and nothing is left behind.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

__all__ = ["BEAT_S", "LIVENESS_S", "STARTUP_S", "Heartbeats", "reap", "start_beating"]

LIVENESS_S = 30.0
"""Default seconds without a heartbeat after which a process is declared hung."""
BEAT_S = 1.0
"""Seconds between two beats of a process."""
STARTUP_S = 30.0
"""A process that never beat yet (its interpreter still starting) gets at least this long."""


class Heartbeats:
    """The launcher's side: the slots, which process writes which, and who fell silent.

    Args:
        ctx: the ``multiprocessing`` context the processes start with (the array is shared
            with them when they start).
        names: every process that will ever run (a restarted one reuses its slot).
        liveness_s: silence, in seconds, after which a process counts as hung; None = never.
        clock: the launcher's clock, the one the processes write (:func:`start_beating`
            writes ``time.monotonic``); a test gives its own, steps it by hand and writes the
            slots.
    """

    def __init__(self, ctx: Any, names: Sequence[str], liveness_s: float | None = LIVENESS_S,
                 *, clock: Callable[[], float] = time.monotonic) -> None:  # fmt: skip
        if liveness_s is not None and not liveness_s > 2 * BEAT_S:
            raise ValueError(f"liveness_s={liveness_s} must be > {2 * BEAT_S:g} (or None)")
        self.slots = ctx.Array("d", len(names), lock=False)  # last beat per process, 0 = none
        self.index = {name: i for i, name in enumerate(names)}
        self.liveness_s = liveness_s
        self._clock = clock
        self._started: dict[str, float] = {}

    def started(self, name: str) -> int:
        """Note that ``name`` (re)starts now; returns its slot for the process to write."""
        i = self.index[name]
        self.slots[i] = 0.0
        self._started[name] = self._clock()
        return i

    def silent(self, names: Sequence[str]) -> tuple[str, float] | None:
        """The first of ``names`` silent for longer than allowed, and for how long."""
        if self.liveness_s is None:
            return None
        now = self._clock()
        for name in names:
            last = self.slots[self.index[name]]
            limit = self.liveness_s if last else max(self.liveness_s, STARTUP_S)
            since = now - (last or self._started.get(name, now))
            if since > limit:
                return name, since
        return None

    def hung(self, names: Sequence[str]) -> tuple[str, str] | None:
        """:meth:`silent`, with the message that names it: ``(name, message)``."""
        silent = self.silent(names)
        if silent is None:
            return None
        name, since = silent
        return name, (
            f"{name} stopped responding: no heartbeat for {since:.0f}s (liveness_s="
            f"{self.liveness_s:g}); it is stopped (SIGSTOP), swapping, or stuck holding the "
            "interpreter"
        )


def start_beating(slots: Any, index: int) -> None:
    """In a supervised process: write its beats into ``slots[index]`` from a daemon thread."""

    def beat() -> None:
        while True:
            slots[index] = time.monotonic()
            time.sleep(BEAT_S)

    threading.Thread(target=beat, daemon=True, name="nobubble-heartbeat").start()


def reap(procs: Sequence[Any], *, grace_s: float, term_s: float = 2.0) -> None:
    """End ``procs`` (``multiprocessing`` processes) for good, in at most about
    ``grace_s + 2 * term_s`` seconds.

    Each gets until ``grace_s`` from now to exit by itself (the caller has told it to stop);
    then the ones still running get SIGTERM - a stopped one (SIGSTOP) SIGKILL at once, since
    it would hold SIGTERM until continued - and those still there ``term_s`` later SIGKILL.
    """
    end = time.monotonic() + grace_s
    for p in procs:
        p.join(timeout=max(0.0, end - time.monotonic()))
    alive = [p for p in procs if p.is_alive()]
    for p in alive:
        if _is_stopped(p.pid):
            p.kill()
        else:
            p.terminate()
    end = time.monotonic() + term_s
    for p in alive:
        p.join(timeout=max(0.0, end - time.monotonic()))
    for p in alive:
        if p.is_alive():
            p.kill()
            p.join(timeout=term_s)


def _is_stopped(pid: int | None) -> bool:
    """Whether ``pid`` is stopped (``T``, or ``t`` under a tracer) per ``/proc``."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[:1] in (["T"], ["t"])
