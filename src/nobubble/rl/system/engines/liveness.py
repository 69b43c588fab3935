"""Heartbeats of the local engine's workers: one shared slot of time per worker, no lock.

A worker's daemon thread writes ``time.monotonic()`` (one clock for every process of the
machine) into its slot every ``BEAT_S``; the engine reads the slots whenever it polls. A
worker that is stopped (SIGSTOP), swapping, or wedged holding the interpreter stops writing,
and after ``liveness_s`` the run ends with an error naming it. A plain shared array rather
than a message on the results queue: a process stopped while it holds a queue's lock would
stall every other writer of that queue with it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from nobubble.distributed import BEAT_S, LIVENESS_S, STARTUP_S

__all__ = ["BEAT_S", "Heartbeats", "start_beating"]

# BEAT_S: seconds between two beats of a worker; STARTUP_S: a worker that never beat yet
# (still starting) gets at least this long - the ranks' own settings (nobubble.distributed)


class Heartbeats:
    """The engine's side: the slots, which worker writes which, and who fell silent.

    Args:
        ctx: the ``multiprocessing`` context the workers start with (the array is shared
            with them when they start).
        names: every worker that will ever run (a restarted one reuses its slot).
        liveness_s: silence, in seconds, after which a worker counts as hung; None = never.
        clock: the engine's clock, the one the workers write (:func:`start_beating` writes
            ``time.monotonic``); a test gives its own, steps it by hand and writes the slots.
    """

    def __init__(self, ctx: Any, names: list[str], liveness_s: float | None = LIVENESS_S, *,
                 clock: Callable[[], float] = time.monotonic) -> None:  # fmt: skip
        if liveness_s is not None and not liveness_s > 2 * BEAT_S:
            raise ValueError(f"liveness_s={liveness_s} must be > {2 * BEAT_S:g} (or None)")
        self.slots = ctx.Array("d", len(names), lock=False)  # last beat per worker, 0 = none
        self.index = {name: i for i, name in enumerate(names)}
        self.liveness_s = liveness_s
        self._clock = clock
        self._started: dict[str, float] = {}

    def started(self, name: str) -> int:
        """Note that ``name`` (re)starts now; returns its slot for the worker to write."""
        i = self.index[name]
        self.slots[i] = 0.0
        self._started[name] = self._clock()
        return i

    def silent(self, names: list[str]) -> tuple[str, float] | None:
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


def start_beating(slots: Any, index: int) -> None:
    """In a worker: write this process's beats into ``slots[index]`` from a daemon thread."""

    def beat() -> None:
        while True:
            slots[index] = time.monotonic()
            time.sleep(BEAT_S)

    threading.Thread(target=beat, daemon=True, name="nobubble-heartbeat").start()
