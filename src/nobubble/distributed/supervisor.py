"""The one supervisor of every process nobubble starts: a guard inside each process and one
check in its launcher, for :func:`~nobubble.distributed.spawn`'s ranks, the RL local
engine's stage workers and the actor-learner's actors alike.

In the process (:func:`supervised`): die with the launcher (the parent-death signal), beat
into the heartbeat slot (:mod:`~nobubble.distributed.liveness`), run the body, and on any
error report ``"Type: message\\n<traceback>"`` through the caller's channel and exit 1.

In the launcher (:class:`Supervisor`): the reports the caller heard, the processes' exit
codes and their heartbeats become one :class:`WorkerError` naming the worker:

- a process that ended with a non-zero exit code without finishing or reporting: ``"<name>
  died with exit code <code> before reporting"``;
- a reported error: ``"<name> failed: <its first line>"``, the whole report in
  ``remote_traceback``;
- a process silent for ``liveness_s``: ``"<name> stopped responding: no heartbeat ..."``.

Of several errors heard together, the root cause is shown: a process that died in silence,
else a worker's own error before a peer's reaction to it ("Connection reset", ...). While
every error heard is such a reaction, the check listens up to ``grace_s`` for the cause.
"""

from __future__ import annotations

import os
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from nobubble.distributed.liveness import LIVENESS_S, Heartbeats, start_beating
from nobubble.lifetime import die_with_parent

__all__ = [
    "GRACE_S",
    "Supervisor",
    "Ward",
    "WorkerError",
    "looks_like_peer_failure",
    "supervised",
]

GRACE_S = 2.0
"""Seconds the check listens for a root cause while every error heard is a peer's symptom."""

# What a process raises because a *peer* went away: symptoms, not causes.
_PEER_SYMPTOMS = (
    "Connection reset",
    "Connection closed",
    "Broken pipe",
    "pair.cc",
    "NCCL communicator was aborted",
)

Receive = Callable[[float], Mapping[str, str]]
"""``receive(timeout_s)``: the reports ``{name: text}`` that arrived within ``timeout_s``
(the caller keeps whatever else came with them, results and messages)."""


class WorkerError(RuntimeError):
    """A named worker (a rank, a stage worker, an actor) raised, died or fell silent.

    ``worker`` is its name (None for a run-level failure such as a timeout);
    ``remote_traceback`` the report it sent, when it sent one."""

    def __init__(self, message: str, worker: str | None = None, remote_traceback: str = "") -> None:
        super().__init__(message)
        self.worker = worker
        self.remote_traceback = remote_traceback


def looks_like_peer_failure(text: str) -> bool:
    """Whether an error reads as a reaction to a peer that went away."""
    return any(s in text for s in _PEER_SYMPTOMS)


@dataclass(frozen=True)
class Ward:
    """A supervised process's handle, given to it when it starts: its name, its launcher's
    pid and its heartbeat slot (``slots[index]``)."""

    name: str
    parent_pid: int
    slots: Any
    index: int


def supervised(ward: Ward, report: Callable[[str], None], body: Callable[..., Any],
               *args: Any) -> Any:  # fmt: skip
    """In a supervised process: die with the launcher, beat, return ``body(*args)``.

    On any error (``SystemExit`` from SIGTERM too) ``report(text)`` sends ``"Type:
    message\\n<traceback>"`` (it must have delivered it when it returns: flush a queue) and
    the process exits 1 - a normal exit, so finalizers still unlink shared memory."""
    die_with_parent(ward.parent_pid)
    start_beating(ward.slots, ward.index)
    try:
        return body(*args)
    except BaseException as err:  # noqa: BLE001 - every failure must reach the launcher
        try:
            report(f"{type(err).__name__}: {err}\n{traceback.format_exc()}")
        except (OSError, ValueError):  # the launcher is gone: nobody to tell
            pass
        raise SystemExit(1) from None


class Supervisor:
    """The launcher's side: the processes by name, their heartbeats, and :meth:`failure`.

    Args:
        ctx: the ``multiprocessing`` context the processes start with.
        names: every process that will ever run (a restarted one reuses its name).
        liveness_s: heartbeat silence after which a process is named; None = never.
        grace_s: how long :meth:`failure` listens for a cause when only symptoms were heard.

    Lifecycle of a name: :meth:`ward` (its handle; the process starts, the caller puts it in
    :attr:`procs`) -> running -> :meth:`finish` (it delivered its result: its exit is no
    failure) or :meth:`failure` names it (:attr:`failed`) -> :meth:`ward` again on restart.
    """

    def __init__(self, ctx: Any, names: Sequence[str], liveness_s: float | None = LIVENESS_S,
                 *, grace_s: float = GRACE_S) -> None:  # fmt: skip
        self.beats = Heartbeats(ctx, names, liveness_s)
        self.grace_s = grace_s
        self.procs: dict[str, Any] = {}
        self.finished: set[str] = set()
        self.failed: set[str] = set()  # named by failure(): not checked again until restarted
        self._reported: dict[str, str] = {}  # reports heard and not yet raised
        self._pid = os.getpid()

    def ward(self, name: str) -> Ward:
        """``name`` (re)starts now: forget its past; returns the handle for its process."""
        self.finished.discard(name)
        self.failed.discard(name)
        self._reported.pop(name, None)
        return Ward(name, self._pid, self.beats.slots, self.beats.started(name))

    @property
    def pending(self) -> list[str]:
        """Workers whose reported error was heard and not yet raised."""
        return list(self._reported)

    def finish(self, name: str) -> None:
        """``name`` delivered what it was started for: its exit is not a failure."""
        self.finished.add(name)

    def hear(self, reports: Mapping[str, str]) -> None:
        """Note reports ``{name: text}`` that the caller received."""
        for name, text in reports.items():
            if name not in self.failed:
                self._reported.setdefault(name, text)

    def check(self, reports: Mapping[str, str], receive: Receive) -> None:
        """:meth:`hear` ``reports``, then raise :meth:`failure` if there is one."""
        self.hear(reports)
        failure = self.failure(receive)
        if failure is not None:
            raise failure

    def failure(self, receive: Receive) -> WorkerError | None:
        """The next failure, or None: a reported error (the root cause of those heard), a
        process that ended without finishing or reporting, or one silent for liveness_s.

        ``receive`` fetches reports that are still in flight: at once for a process that
        has ended (what it sent is in the pipe by then), up to ``grace_s`` while every error
        heard is a peer's symptom. The worker named is in :attr:`failed` afterwards; other
        errors heard stay for the next call."""
        self._await_cause(receive)
        if self._ended():
            self.hear(receive(0.0))  # an ended process's report is already in the pipe
        ended = self._ended()
        if ended:
            name = ended[0]
            code = self.procs[name].exitcode
            return self._named(WorkerError(f"{name} died with exit code {code} before reporting",
                                           name))  # fmt: skip
        if self._reported:
            causes = [n for n, text in self._reported.items() if not looks_like_peer_failure(text)]
            name = causes[0] if causes else next(iter(self._reported))
            text = self._reported.pop(name)
            first = text.splitlines()[0] if text else "unknown error"
            return self._named(WorkerError(f"{name} failed: {first}", name, text))
        running = [n for n, p in self.procs.items() if self._watched(n) and p.is_alive()]
        hung = self.beats.hung(running)
        return None if hung is None else self._named(WorkerError(hung[1], hung[0]))

    def _await_cause(self, receive: Receive) -> None:
        """Listen while every error heard is a symptom, nobody ended in silence, another
        process may still speak, and ``grace_s`` has not passed."""
        end = time.monotonic() + self.grace_s
        while (
            self._reported
            and all(looks_like_peer_failure(t) for t in self._reported.values())
            and not self._ended()
            and any(self._watched(n) and n not in self._reported for n in self.procs)
            and time.monotonic() < end
        ):
            self.hear(receive(0.05))

    def _watched(self, name: str) -> bool:
        return name not in self.finished and name not in self.failed

    def _ended(self) -> list[str]:
        """Processes gone with a non-zero exit code (a signal's is negative) without
        finishing, reporting or being named. Exit code 0 is a process that chose to leave
        (a rank that vanished on purpose): the others, or a timeout, speak for it."""
        return [
            n
            for n, p in self.procs.items()
            if self._watched(n) and n not in self._reported and p.exitcode not in (0, None)
        ]

    def _named(self, err: WorkerError) -> WorkerError:
        if err.worker is not None:
            self.failed.add(err.worker)
        return err
