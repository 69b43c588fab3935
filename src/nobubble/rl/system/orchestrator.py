"""One orchestrator for every mode and engine (local processes or Ray actors), run in the
driver: admission, routing between the stages, bookkeeping, checkpoints, and the requeue of
the groups in flight after a resume or a worker restart (``docs/rl/system.md``).
"""

from __future__ import annotations

import random
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nobubble.rl.algo.replay import linear_beta
from nobubble.rl.system.checkpoint import CheckpointStore, RunProgress
from nobubble.rl.system.config import RunConfig, describe_value
from nobubble.rl.system.engines.worker import Engine, Message, WorkerError
from nobubble.rl.system.experience import ExperienceBuffer, GroupReplay
from nobubble.rl.system.result import CurvePoint, RunResult, stage_busy
from nobubble.rl.system.rewards import RewardWatch
from nobubble.rl.system.types import GroupRequest, SampleGroup, Span
from nobubble.rl.system.weight_sync import PublishedWeights

__all__ = ["Orchestrator", "run", "MAX_RESTARTS"]

MAX_RESTARTS = 3  # per worker, with restart_workers


@dataclass
class Routing:
    """Where every admitted group is until it is buffered, and which workers are free."""

    # group id -> its request, until buffered (its stage: the ledger's state)
    requests: dict[int, GroupRequest] = field(default_factory=dict)
    held: dict[str, list[int]] = field(default_factory=dict)  # worker -> its group ids
    requeued: list[GroupRequest] = field(default_factory=list)  # before anything new
    pending_reward: list[SampleGroup] = field(default_factory=list)
    idle: dict[str, list[str]] = field(default_factory=lambda: {"rollout": [], "reward": []})
    rng_to_send: dict[str, Any] = field(default_factory=dict)  # generator -> RNG (resume)

    def assign(self, stage: str, group_ids: list[int]) -> str:
        """The longest idle worker of ``stage``, now holding ``group_ids``."""
        worker = self.idle[stage].pop(0)
        self.held[worker] = group_ids
        return worker

    def free(self, worker: str) -> None:
        """``worker`` (not a trainer) said ready or answered: it holds nothing, waits."""
        self.held.pop(worker, None)
        self.idle.get(worker.split("-")[0], []).append(worker)

    def release(self, worker: str) -> list[GroupRequest]:
        """Forget ``worker`` (it died); the requests of the groups it held."""
        for idle in self.idle.values():
            if worker in idle:
                idle.remove(worker)
        self.rng_to_send.pop(worker, None)
        lost = self.held.pop(worker, [])
        self.pending_reward = [g for g in self.pending_reward if g.group_id not in lost]
        return [self.requests[gid] for gid in lost]


class Orchestrator:
    """Drives one run of ``cfg`` on ``engine``; :meth:`run` returns a :class:`RunResult`."""

    def __init__(
        self,
        cfg: RunConfig,
        engine: Engine,
        *,
        on_step: Callable[[int, dict[str, float]], None] | None = None,
    ) -> None:
        self.cfg = cfg
        self.engine = engine
        self.on_step = on_step
        self.task = cfg.make_task()
        self.buffer = ExperienceBuffer[SampleGroup](
            batch_groups=cfg.batch_groups,
            max_staleness=cfg.effective_max_staleness,
            drop_staleness=cfg.effective_drop_staleness,
        )
        # batches at the trainer, oldest first: (fresh groups, replayed groups, checkpoint
        # folder). With a staleness bound >= 1 the next batch is sent while one trains.
        self._train_queue: deque[tuple[list[SampleGroup], list[SampleGroup], str | None]] = deque()
        self._train_depth = 2 if cfg.effective_drop_staleness >= 1 else 1
        replay = GroupReplay(cfg.replay, seed=cfg.seed) if cfg.replay.on else None
        self._progress = RunProgress(random.Random(cfg.seed), PublishedWeights(), replay)
        self._store = CheckpointStore(cfg.checkpoint_dir) if cfg.checkpoint_dir else None
        self._resumed_from: str | None = None
        self._wall_offset = 0.0  # seconds the run had spent before it resumed
        self._restarts: list[str] = []  # "<worker>: <error>" for every restart so far
        self._routing = Routing()
        self._stopping = False
        self._spans: list[Span] = []
        # the reward sources as the user named them, for RewardWatch's error
        names = [str(describe_value(r.fn)) for r in cfg.reward_sources()]
        names += [cfg.reward_url] if cfg.reward_url else []
        self._reward_watch = RewardWatch(cfg.reward_config(), " + ".join(names or ["task"]))
        self._eval_pending = 0
        self._t0 = 0.0

    # -- admission and dispatch --------------------------------------------------------

    def _admit(self, n: int) -> list[GroupRequest]:
        """Up to ``n`` new groups, as many as the buffer admits; in one-step-off and sync,
        which switch weights only between whole requests, all ``n`` or none."""
        p = self._progress
        if self.cfg.mode != "fully-async" and not self.buffer.can_admit(p.version, n):
            return []
        reqs: list[GroupRequest] = []
        while len(reqs) < n and self.buffer.can_admit(p.version):
            pid = p.rng.randrange(self.task.num_prompts)
            gid = p.next_group
            p.next_group += 1
            self.buffer.admit(gid, p.version)
            req = GroupRequest(gid, pid, self.task.prompts[pid], time.time())
            self._routing.requests[gid] = req
            reqs.append(req)
        return reqs

    def _dispatch(self) -> None:
        if self._stopping:
            return
        r = self._routing
        while r.idle["rollout"]:
            num_groups = self.cfg.effective_groups_per_rollout
            if r.requeued:  # already admitted: generated again before anything new
                reqs, r.requeued = r.requeued[:num_groups], r.requeued[num_groups:]
            elif not (reqs := self._admit(num_groups)):
                break  # no room in the buffer: wait for the next version
            worker = r.assign("rollout", [req.group_id for req in reqs])
            rng = r.rng_to_send.pop(worker, None)
            self.engine.submit_rollout(worker, reqs, rng)
        while r.idle["reward"] and r.pending_reward:
            # an idle reward worker takes an equal share of everything waiting
            share = -(-len(r.pending_reward) // len(r.idle["reward"]))
            groups, r.pending_reward = r.pending_reward[:share], r.pending_reward[share:]
            worker = r.assign("reward", [g.group_id for g in groups])
            self.engine.submit_reward(worker, groups)
        while len(self._train_queue) < self._train_depth:
            trains_at = self._progress.version + len(self._train_queue)  # trains this batch
            step = trains_at + 1
            sync = bool(self.cfg.sync_every) and step % self.cfg.sync_every == 0
            # a full sync needs the weights of the step before it: no prefetch
            if step > self.cfg.steps or (sync and self._train_queue):
                break
            batch = self.buffer.take_batch(trains_at, sync=sync)
            if batch is None:
                break
            drawn: list[tuple[SampleGroup, float]] = []
            if self._progress.replay is not None and not sync:
                rc, drop = self.cfg.replay, self.cfg.effective_drop_staleness
                beta = linear_beta(step, self.cfg.steps, rc.beta)
                drawn = self._progress.replay.sample(rc.groups_per_step, trains_at, drop, beta)
            replayed = [g for g, _ in drawn]
            weights = [1.0] * len(batch) + [w for _, w in drawn] if drawn else None
            last, every = step == self.cfg.steps, self.cfg.checkpoint_every
            evaluate = step % self.cfg.eval_every == 0 or last
            ckpt = None
            if self._store is not None and (last or (every and step % every == 0)):
                ckpt = str(self._store.new_dir(step))
            self.engine.submit_train(batch + replayed, evaluate, ckpt, weights)
            self._train_queue.append((batch, replayed, ckpt))
            self._eval_pending += evaluate

    # -- messages -------------------------------------------------------------------------

    def _handle(self, msg: Message) -> None:
        self._spans.extend(msg.spans)
        r, p = self._routing, self._progress
        if msg.kind in ("ready", "rollout", "reward"):
            r.free(msg.worker)
        if msg.kind == "rollout":
            if msg.state is not None:
                p.rollout_rng[msg.worker] = msg.state
            for g in msg.payload:
                self.buffer.generated(g)
                p.group_versions[g.group_id] = [s.policy_version for s in g.samples]
                r.pending_reward.append(g)
        elif msg.kind == "reward":
            for g in msg.payload:
                del r.requests[g.group_id]
                self.buffer.put(g)  # a failed reward: dropped, "reward_failed"
                self._reward_watch.record(g)  # a reward that never succeeds ends the run
        elif msg.kind == "train":
            self._on_train(msg)
        elif msg.kind == "eval":
            ev, wall = msg.payload, msg.payload.span.end_s - self._t0
            self._eval_pending = max(0, self._eval_pending - 1)
            point = CurvePoint(ev.version, wall, p.train_reward, ev.mean_reward, ev.accuracy)
            p.curve.append(point)
            target = self.cfg.target_accuracy
            self._stopping |= target is not None and ev.accuracy >= target

    def _on_train(self, msg: Message) -> None:
        res, p = msg.payload, self._progress
        if res.version <= p.version:
            raise WorkerError(f"trainer published version {res.version} after {p.version}")
        batch, replayed, ckpt = self._train_queue.popleft()
        by = res.trained_by  # group id -> learner; empty with one learner (all learner 0)
        missing = {g.group_id for g in batch + replayed} - set(by)
        if self.cfg.learners > 1 and missing:
            raise WorkerError(f"step {res.version}: no learner reported groups {sorted(missing)}")
        p.published.publish(res.weight_digests)
        p.published.check_trained(  # every trained group sampled with its versions' weights
            (g.generator or None, f"{g.generator} (group {g.group_id})", g.weight_digests)
            for g in batch
        )
        self.buffer.mark_trained(batch, res.version, by)
        for g in replayed:
            self.buffer.reused(g, res.version, by.get(g.group_id, 0))
        if p.replay is not None:
            p.replay.add(batch)
        p.step_metrics.append({"step": res.version, **res.metrics})
        p.version = res.version
        for lag in res.staleness:
            p.staleness[lag] += self.cfg.group_size
        p.token_staleness.update(res.token_staleness)
        p.train_reward = res.metrics.get("reward")
        if self.on_step is not None:
            self.on_step(res.version, {**res.metrics, "staleness_max": max(res.staleness)})
        self._stopping |= p.version >= self.cfg.steps
        if ckpt is not None and self._store is not None:
            self._store.commit(Path(ckpt), {"config": self.cfg.to_dict(), **self.snapshot()})

    # -- recovery -------------------------------------------------------------------------

    def snapshot(self) -> dict[str, Any]:
        """The driver's part of a checkpoint, at a step boundary. A batch queued at the
        trainer (prefetched, not trained) is back among the buffer's ready groups, so a
        resumed run trains it."""
        buffer = self.buffer.state_dict()
        queued = [g for batch, _, _ in self._train_queue for g in batch]
        buffer["ready"] = sorted([*buffer["ready"], *queued], key=lambda g: g.group_id)
        return {
            "progress": self._progress,  # pickled at once by the commit
            "buffer": buffer,
            "in_flight": [req for _, req in sorted(self._routing.requests.items())],
            "wall_s": time.time() - self._t0,
        }

    def _restore(self, state: dict[str, Any]) -> None:
        """Continue from a :meth:`snapshot`: every group in flight is generated again."""
        self._progress = state["progress"]
        self._resumed_from, self._wall_offset = state["resumed_from"], float(state["wall_s"])
        self.buffer.load_state_dict(state["buffer"])
        for req in state["in_flight"]:
            self._requeue(req, "resumed")
        self._routing.rng_to_send = dict(self._progress.rollout_rng)
        self._stopping = self._progress.version >= self.cfg.steps

    def _requeue(self, req: GroupRequest, reason: str) -> None:
        self.buffer.requeue(req.group_id, reason)
        self._routing.requests[req.group_id] = req
        self._routing.requeued.append(req)

    def _restart(self, err: WorkerError) -> None:
        """Replace the worker ``err`` blames and requeue the groups it held; re-raises
        ``err`` when it may not be restarted (no ``restart_workers``, the trainer, or a
        worker past :data:`MAX_RESTARTS`)."""
        worker = err.worker
        if worker is None or worker.startswith("trainer") or not self.cfg.restart_workers:
            raise err
        if sum(r.split(":")[0] == worker for r in self._restarts) >= MAX_RESTARTS:
            raise WorkerError(f"{worker} failed {MAX_RESTARTS + 1} times; last: {err}", worker)
        self._restarts.append(f"{worker}: {str(err).splitlines()[0]}")
        for req in self._routing.release(worker):
            self._requeue(req, "worker_died")
        self.engine.restart(worker)

    # -- the loop ---------------------------------------------------------------------------

    def run(self) -> RunResult:
        # before any worker starts: a refusal loses nothing
        state = None if self._store is None else self._store.resume(self.cfg)
        if state is not None:
            self._restore(state)
        workers = self.engine.start(self.cfg)
        try:
            return self._loop(workers)
        finally:
            self.engine.shutdown()

    def _loop(self, workers: list[str]) -> RunResult:
        cfg = self.cfg
        waiting = set(workers)
        deadline = time.monotonic() + cfg.timeout_s
        while waiting:  # every worker says ready (imports, model build) before the clock starts
            for msg in self._poll(deadline):
                if msg.kind != "ready":
                    raise WorkerError(f"{msg.worker}: unexpected {msg.kind} before ready")
                waiting.discard(msg.worker)
                self._handle(msg)
        self._t0 = time.time() - self._wall_offset
        if self._resumed_from is None:
            self.engine.submit_eval()  # version 0, the starting accuracy
            self._eval_pending += 1
        budget_end = None if cfg.time_budget_s is None else time.monotonic() + cfg.time_budget_s
        while True:
            self._stopping |= budget_end is not None and time.monotonic() > budget_end
            if self._stopping and not self._train_queue:
                break
            self._dispatch()
            for msg in self._poll(deadline):
                self._handle(msg)
        curve, version = self._progress.curve, self._progress.version
        if not curve or curve[-1].step != version:
            self.engine.submit_eval()
            self._eval_pending += 1
        while self._eval_pending:
            for msg in self._poll(deadline):
                if msg.kind in ("eval", "train"):
                    self._handle(msg)
                else:
                    self._spans.extend(msg.spans)
        return self._result()

    def _poll(self, deadline: float) -> list[Message]:
        last = time.monotonic()
        while True:
            try:
                msgs = self.engine.poll(0.5)
            except WorkerError as err:
                self._restart(err)  # re-raises unless the worker may be restarted
                last = time.monotonic()
                continue
            if msgs:
                return msgs
            now = time.monotonic()
            if now > deadline:
                raise WorkerError(
                    f"run exceeded timeout_s={self.cfg.timeout_s}s; raise it if the run is just slow"
                )
            if now - last > self.cfg.stall_timeout_s:
                in_flight = self.buffer.states(self._routing.requests)
                raise WorkerError(
                    f"no stage answered for {self.cfg.stall_timeout_s:.0f}s (in flight: "
                    f"{in_flight}, trainer busy: {bool(self._train_queue)}); a worker is stuck"
                )

    def _result(self) -> RunResult:
        p = self._progress
        self.buffer.close(sorted(self._routing.requests))
        ledger = self.buffer.summary()
        curve = sorted(p.curve, key=lambda c: (c.step, c.wall_s))
        trained = (s for s in self._spans if s.stage == "trainer" and s.name.startswith("train"))
        end = max((s.end_s for s in trained), default=self._t0)
        wall = max(end - self._t0, 1e-9)
        busy, idle = stage_busy(self._spans, self._t0, end)
        return RunResult(
            config=self.cfg.to_dict(),
            steps=p.version,
            wall_s=wall,
            trained_samples=ledger.trained,
            initial_accuracy=curve[0].accuracy if curve else float("nan"),
            final_accuracy=curve[-1].accuracy if curve else float("nan"),
            curve=curve,
            staleness_hist=dict(sorted(p.staleness.items())),
            token_staleness_hist=dict(sorted(p.token_staleness.items())),
            idle_ratio=idle,
            busy_s=busy,
            ledger=ledger,
            fates=dict(self.buffer.fate),
            group_versions=p.group_versions,
            weight_versions=p.published.versions,
            spans=sorted(self._spans, key=lambda s: s.start_s),
            t0=self._t0,
            requeues=list(self.buffer.requeues),
            restarts=list(self._restarts),
            resumed_from=self._resumed_from,
            step_metrics=list(p.step_metrics),
        )


def run(
    cfg: RunConfig, *, on_step: Callable[[int, dict[str, float]], None] | None = None
) -> RunResult:
    """Run ``cfg`` on its engine (``local`` or ``ray``) and return the result."""
    if cfg.engine == "ray":
        from nobubble.rl.system.engines.ray import RayEngine

        engine: Engine = RayEngine()
    else:
        from nobubble.rl.system.engines.local import LocalEngine

        engine = LocalEngine()
    return Orchestrator(cfg, engine, on_step=on_step).run()
