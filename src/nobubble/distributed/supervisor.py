"""The one supervisor of every process nobubble starts (spawn's ranks, the RL local engine's
stage workers, the actor-learner's actors). In the process, :func:`supervised`: die with the
launcher, beat into a shared slot, run the body, report any error and exit 1. In the launcher,
:class:`Supervisor` turns the reports heard, exit codes and heartbeats (:class:`Heartbeats`)
into one :class:`WorkerError` naming the worker and the root cause; :func:`reap` ends them all.
"""

from __future__ import annotations

import ctypes
import multiprocessing as mp
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from nobubble.files import proc_stat

__all__ = [
    "BEAT_S",
    "GRACE_S",
    "LIVENESS_S",
    "STARTUP_S",
    "Heartbeats",
    "Supervisor",
    "Ward",
    "WorkerError",
    "die_with_parent",
    "launcher_alive",
    "looks_like_peer_failure",
    "reap",
    "start_beating",
    "supervised",
]

LIVENESS_S = 30.0
"""Default seconds without a heartbeat after which a process is declared hung."""
BEAT_S = 1.0
"""Seconds between two beats of a process."""
STARTUP_S = 30.0
"""A process that never beat yet (its interpreter still starting) gets at least this long."""


class Heartbeats:
    """The launcher's side of the heartbeats: one shared slot of ``time.monotonic()`` per
    process, no lock (a process stopped while holding a queue's lock would stall every other
    writer; a slot needs no reader to drain it), which process writes which, who fell silent.

    Args:
        ctx: the ``multiprocessing`` context the processes start with (the array is shared
            with them when they start).
        names: every process that will ever run (a restarted one reuses its slot).
        liveness_s: silence, in seconds, after which a process counts as hung; None = never.
        clock: the launcher's clock, the one the processes write (``time.monotonic``); a
            test steps its own by hand.
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
    fields = proc_stat(pid)
    return fields is not None and fields[0] in ("T", "t")


def die_with_parent(parent_pid: int) -> None:
    """Make this process die when ``parent_pid`` (its launcher) does (Linux: the
    parent-death signal, through the forkserver that exits with the launcher), so a killed
    ``nobubble`` command leaves no worker behind it."""
    if sys.platform != "linux":
        return
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    if not launcher_alive(parent_pid):  # the launcher died before the signal was armed
        os._exit(1)
    _release_forkserver()


def launcher_alive(parent_pid: int) -> bool:
    """Whether this process's launcher ``parent_pid`` is still its parent, directly or
    through the forkserver that forked it."""
    parent = os.getppid()
    return parent_pid in (parent, _parent_of(parent))


def _release_forkserver() -> None:
    """Close this process's copy of the forkserver's keep-alive pipe: the server lives while
    any holder does, so a rank holding it would keep the server, and through the server's
    death signal itself, alive after its launcher was killed."""
    from multiprocessing import forkserver

    server = getattr(forkserver, "_forkserver", None)
    fd = getattr(server, "_forkserver_alive_fd", None)
    if fd is not None and mp.parent_process() is not None:
        os.close(fd)
        server._forkserver_alive_fd = None  # type: ignore[union-attr]


def _parent_of(pid: int) -> int | None:
    """The parent of ``pid`` from ``/proc`` (None when it is gone)."""
    fields = proc_stat(pid)
    return None if fields is None else int(fields[1])


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
