"""The local engine: every stage worker is its own process on this machine.

Why processes, not threads: the stages are Python loops around small tensor ops (a 64-wide
transformer on ~10-token sequences); most of their time is Python and dispatch overhead
under the GIL, not long kernels that release it, so two threads would mostly take turns.
Two processes with one torch thread each do run at the same time on two cores.

- Processes start from a forkserver preloaded with torch
  (:func:`~nobubble.distributed.worker_context`; no forked torch state); each runs one torch
  thread (:meth:`RunConfig.torch_threads`). In ``sync`` mode only one stage works at a time, so one
  core idles - that idle core is the bubble the asynchronous modes remove. (Giving the lone
  stage two intra-op threads instead was 5x *slower* here: the ops are too small to split
  and the threads spin against each other and the machine's other load.)
- Commands and results travel through ``multiprocessing`` queues as pickled bytes (a group's
  tensors are a few hundred bytes; pickling by value avoids one shared-memory segment per
  tensor).
- Weights travel through :class:`~nobubble.rl.system.weight_sync.SharedWeights`: the trainer copies
  its parameters into one shared-memory tensor and bumps the version, a generator copies
  them out before a chunk when the version moved. With partial rollouts the generator also
  reads them between tokens (``RolloutWorker.pull_weights`` is the shared tensor's ``pull``).
- Nothing waits forever: ``poll`` has a timeout, and the one supervisor of spawn's ranks
  (:class:`~nobubble.distributed.Supervisor`) names a worker that died without a word
  (exit code), raised (its error's first line) or fell silent (no heartbeat for
  :data:`~nobubble.distributed.LIVENESS_S`); ``shutdown`` ends what does not stop (a
  stopped process with SIGKILL: :func:`~nobubble.distributed.reap`). Workers run under
  :func:`~nobubble.distributed.supervised`, so they die with the driver (the parent-death
  signal) and a killed run leaves none behind. ``restart`` replaces one worker with a fresh
  process of the same name.
- ``learners > 1``: the learner processes join one gloo group on a free port of 127.0.0.1
  before they say ready; the engine splits each batch among them and merges their answers
  (:mod:`~nobubble.rl.system.engines.learners`). A learner other than 0 in ``async`` /
  ``staleness`` reads the newest published weights from the shared tensor, as a generator
  does. A learner's error that only reports a dead peer is blamed on that peer.
"""

from __future__ import annotations

import pickle
import queue
from typing import Any

import torch
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
from nobubble.rl.system.engines.learners import StepCollector, learner_names, split_groups
from nobubble.rl.system.engines.protocol import Message, WorkerError
from nobubble.rl.system.weight_sync import SharedWeights

__all__ = ["LocalEngine"]


def _worker_main(
    ward: Ward,
    cfg: RunConfig,
    inq: Any,
    outq: Any,
    shared: SharedWeights,
    threads: int,
    incarnation: int,
    learner_port: int | None,
) -> None:
    """One stage worker under the supervisor's guard; its error goes on ``outq`` after the
    messages it sent before it, as ``("error", name, report)``."""

    def report(text: str) -> None:
        outq.put(pickle.dumps(("error", ward.name, text)))
        outq.close()
        outq.join_thread()  # delivered before the process exits

    supervised(ward, report, _serve, ward, cfg, inq, outq, shared, threads, incarnation,
               learner_port)  # fmt: skip


def _serve(ward: Ward, cfg: RunConfig, inq: Any, outq: Any, shared: SharedWeights,
           threads: int, incarnation: int, learner_port: int | None) -> None:  # fmt: skip
    """Answer the driver's commands until ``stop`` (or the driver is gone)."""
    from nobubble.rl.system.engines.worker import StageWorker

    torch.set_num_threads(threads)

    name, parent = ward.name, ward.parent_pid
    worker = StageWorker(name, cfg, incarnation)
    have = -1
    if worker.kind == "trainer" and learner_port is not None:
        worker.join_learners("127.0.0.1", learner_port)
    if worker.kind == "trainer" and worker.rank == 0:
        shared.publish(worker.learner.model, worker.learner.version)
    if worker.kind == "rollout":
        worker.rollout.pull_weights = shared.pull  # between tokens, with partial rollouts
    outq.put(pickle.dumps(Message("ready", name)))
    while True:
        try:
            cmd = pickle.loads(inq.get(timeout=1.0))
        except queue.Empty:
            if not launcher_alive(parent):  # the driver is gone: do not linger
                return
            continue
        op = cmd[0]
        if op == "stop":
            return
        if op == "rollout":
            have = shared.pull(worker.rollout.model, have)
            worker.rollout.version = have
            msgs = worker.rollout_cmd(cmd[1], cmd[2])
            have = worker.rollout.version  # newer if weights arrived between tokens
        elif op == "reward":
            msgs = worker.reward_cmd(cmd[1])
        elif op == "train":
            if worker.learner.pushes_gradients:  # it computes on published weights
                have = shared.pull(worker.learner.model, have)
                worker.learner.version = have
            msg = worker.train_cmd(cmd[1], cmd[3], cmd[4])
            if worker.rank == 0:
                shared.publish(worker.learner.model, worker.learner.version)
            msgs = [msg, worker.eval_cmd()] if cmd[2] else [msg]
        elif op == "eval":
            msgs = [worker.eval_cmd()]
        else:
            raise ValueError(f"{name}: unknown command {op!r}")
        for m in msgs:
            outq.put(pickle.dumps(m))


class LocalEngine:
    """Stage workers as local processes (see the module docstring)."""

    def __init__(self) -> None:
        self._inq: dict[str, Any] = {}
        self._outq: Any = None
        self._shared: SharedWeights | None = None
        self._ctx: Any = None
        self._cfg: RunConfig | None = None
        self._incarnation: dict[str, int] = {}
        self._supervisor: Supervisor | None = None
        self._inbox: list[Message] = []  # received, not yet returned by poll
        self._learner_port: int | None = None
        self._collector: StepCollector | None = None

    def start(self, cfg: RunConfig) -> list[str]:
        ctx = self._ctx = worker_context()
        self._cfg = cfg
        self._shared = SharedWeights(cfg.build_policy(), ctx)
        self._outq = ctx.Queue()
        names = [f"rollout-{i}" for i in range(cfg.num_rollout_workers)]
        names += [f"reward-{i}" for i in range(cfg.num_reward_workers)]
        names += learner_names(cfg.learners)
        self._supervisor = Supervisor(ctx, names)
        if cfg.learners > 1:
            self._learner_port = free_port()
            self._collector = StepCollector(cfg.learners)
        for name in names:
            self._spawn(name)
        return names

    def _spawn(self, name: str) -> None:
        assert self._cfg is not None and self._ctx is not None and self._supervisor is not None
        cfg = self._cfg
        incarnation = self._incarnation.get(name, -1) + 1
        self._incarnation[name] = incarnation
        self._inq[name] = self._ctx.Queue()
        threads = 1 if name.startswith("reward") else cfg.torch_threads()
        port = self._learner_port if name.startswith("trainer") else None
        ward = self._supervisor.ward(name)
        proc = self._ctx.Process(
            target=_worker_main,
            args=(ward, cfg, self._inq[name], self._outq, self._shared, threads, incarnation,
                  port),
            daemon=True,
            name=f"nobubble-rl-{name}",
        )  # fmt: skip
        proc.start()
        self._supervisor.procs[name] = proc

    def restart(self, worker: str) -> None:
        """Stop ``worker`` if it still runs and start a fresh process in its place; the new
        one says ``ready``. Commands queued for the old one are dropped."""
        if worker.startswith("trainer"):
            raise WorkerError(f"{worker} is not restarted; resume from a checkpoint", worker)
        assert self._supervisor is not None
        reap([self._supervisor.procs.pop(worker)], grace_s=0.0, term_s=5.0)
        self._spawn(worker)

    def _send(self, worker: str, cmd: tuple) -> None:
        self._inq[worker].put(pickle.dumps(cmd))

    def submit_rollout(
        self, worker: str, requests: list, weights: Any, rng_state: Any = None
    ) -> None:
        self._send(worker, ("rollout", requests, rng_state))

    def submit_reward(self, worker: str, groups: list) -> None:
        self._send(worker, ("reward", groups))

    def submit_train(
        self,
        groups: list,
        evaluate: bool,
        checkpoint: str | None = None,
        weights: list[float] | None = None,
    ) -> None:
        if self._collector is None:
            self._send("trainer", ("train", groups, evaluate, checkpoint, weights))
            return
        shards = split_groups(groups, weights, self._collector.num_learners)
        self._collector.expect([[g.group_id for g in shard] for shard, _ in shards])
        for rank, (name, (shard, w)) in enumerate(zip(learner_names(len(shards)), shards)):
            first = rank == 0  # learner 0 evaluates and writes the checkpoint
            self._send(name, ("train", shard, evaluate and first, checkpoint if first else None, w))

    def submit_eval(self) -> None:
        self._send("trainer", ("eval",))

    def poll(self, timeout_s: float) -> list[Message]:
        """Messages that arrived within ``timeout_s`` (all that are queued, once one is).

        A worker's failure (:class:`~nobubble.distributed.Supervisor`: an error it reported,
        an exit, a silence) is raised once the messages that arrived before it were
        returned, so no other worker's result is lost with it."""
        supervisor = self._supervisor
        assert supervisor is not None
        if not self._inbox and not supervisor.pending:
            supervisor.hear(self._receive(timeout_s))
        out, self._inbox = self._inbox, []
        if self._collector is not None:
            out = self._collector.feed(out)
        if not out:
            failure = supervisor.failure(self._receive)
            if failure is not None:
                raise failure
        return out

    def _receive(self, timeout_s: float) -> dict[str, str]:
        """Move what arrived within ``timeout_s`` into the inbox; return the errors by name."""
        raw: list[bytes] = []
        try:
            raw.append(self._outq.get(timeout=timeout_s))
            while True:
                raw.append(self._outq.get_nowait())
        except queue.Empty:
            pass
        errors: dict[str, str] = {}
        for blob in raw:
            item = pickle.loads(blob)
            if isinstance(item, tuple) and item[0] == "error":
                errors.setdefault(item[1], item[2])
            else:
                self._inbox.append(item)
        return errors

    def shutdown(self) -> None:
        procs = self._supervisor.procs if self._supervisor is not None else {}
        for name, proc in procs.items():
            if proc.is_alive():
                try:
                    self._send(name, ("stop",))
                except (OSError, ValueError):
                    pass
        reap(list(procs.values()), grace_s=5.0)
        procs.clear()
