"""The local engine: every stage worker is its own process on this machine under
:func:`~nobubble.distributed.supervised` (``docs/rl/system.md``, engines); the
:class:`~nobubble.distributed.Supervisor` names a worker that died, raised or fell silent.
"""

from __future__ import annotations

import pickle
import queue
from contextlib import suppress
from typing import Any

import torch.multiprocessing  # noqa: F401 - registers the tensor reductions shared weights use

from nobubble.distributed import (
    Supervisor,
    Ward,
    free_port,
    launcher_alive,
    reap,
    supervised,
    worker_context,
)
from nobubble.rl.system.config import RunConfig
from nobubble.rl.system.engines.worker import Engine, Message, StageWorker, WorkerError
from nobubble.rl.system.weight_sync import SharedWeights

__all__ = ["LocalEngine"]


def _worker_main(ward: Ward, cfg: RunConfig, inq: Any, outq: Any, shared: SharedWeights,
                 incarnation: int, learner_port: int | None) -> None:  # fmt: skip
    """One stage worker: answers the driver's commands until ``stop`` (or the driver is
    gone); its error goes on ``outq`` after its messages, as ``("error", name, report)``."""

    def report(text: str) -> None:
        outq.put(pickle.dumps(("error", ward.name, text)))
        outq.close()
        outq.join_thread()  # delivered before the process exits

    def serve() -> None:
        worker = StageWorker(ward.name, cfg, incarnation)
        if learner_port is not None:  # a trainer, with several learners
            worker.join_learners("127.0.0.1", learner_port)
        outq.put(pickle.dumps(worker.ready(shared)))
        while True:
            try:
                cmd = pickle.loads(inq.get(timeout=1.0))
            except queue.Empty:
                if not launcher_alive(ward.parent_pid):  # the driver is gone: do not linger
                    return
                continue
            if cmd[0] == "stop":
                return
            for m in worker.handle(cmd, shared):
                outq.put(pickle.dumps(m))

    supervised(ward, report, serve)


class LocalEngine(Engine):
    """Stage workers as local processes (see the module docstring)."""

    def __init__(self) -> None:
        super().__init__()
        self._inq: dict[str, Any] = {}
        self._outq: Any = None
        self._shared: SharedWeights | None = None
        self._ctx: Any = None
        self._supervisor: Supervisor | None = None
        self._inbox: list[Message] = []  # received, not yet returned by poll
        self._learner_port: int | None = None

    def _start(self, cfg: RunConfig, names: list[str]) -> None:
        ctx = self._ctx = worker_context()
        self._shared = SharedWeights(cfg.build_policy(), ctx)
        self._outq = ctx.Queue()
        self._supervisor = Supervisor(ctx, names)
        if cfg.learners > 1:
            self._learner_port = free_port()

    def _launch(self, name: str, incarnation: int) -> None:
        assert self._cfg is not None and self._ctx is not None and self._supervisor is not None
        self._inq[name] = self._ctx.Queue()
        port = self._learner_port if name.startswith("trainer") else None
        ward = self._supervisor.ward(name)
        proc = self._ctx.Process(
            target=_worker_main,
            args=(ward, self._cfg, self._inq[name], self._outq, self._shared, incarnation, port),
            daemon=True,
            name=f"nobubble-rl-{name}",
        )
        proc.start()
        self._supervisor.procs[name] = proc

    def _stop(self, worker: str) -> None:
        assert self._supervisor is not None
        reap([self._supervisor.procs.pop(worker)], grace_s=0.0, term_s=5.0)

    def _send(self, worker: str, cmd: tuple) -> None:
        self._inq[worker].put(pickle.dumps(cmd))

    def _receive(self, timeout_s: float) -> list[Message]:
        assert self._supervisor is not None
        if not self._inbox and not self._supervisor.pending:
            self._supervisor.hear(self._drain(timeout_s))
        out, self._inbox = self._inbox, []
        return out

    def _failure(self) -> WorkerError | None:
        assert self._supervisor is not None
        return self._supervisor.failure(self._drain)

    def _drain(self, timeout_s: float) -> dict[str, str]:
        """Move what arrived within ``timeout_s`` into the inbox; return the errors by name."""
        errors: dict[str, str] = {}
        with suppress(queue.Empty):
            blob = self._outq.get(timeout=timeout_s)
            while True:
                item = pickle.loads(blob)
                if isinstance(item, tuple) and item[0] == "error":
                    errors.setdefault(item[1], item[2])
                else:
                    self._inbox.append(item)
                blob = self._outq.get_nowait()
        return errors

    def shutdown(self) -> None:
        procs = self._supervisor.procs if self._supervisor is not None else {}
        for name, proc in procs.items():
            if proc.is_alive():
                with suppress(OSError, ValueError):
                    self._send(name, ("stop",))
        reap(list(procs.values()), grace_s=5.0)
        procs.clear()
