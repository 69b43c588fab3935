"""The Ray engine: every stage worker is a Ray actor; learner 0 puts each version's state
dict in the object store and the engine hands the reference to an actor with its next
command, so weights never pass through the driver. A local Ray on 127.0.0.1
(:func:`start_local_ray`), or ``RunConfig.ray_address`` (probed: :func:`check_ray_address`)
with ``RunConfig.ray_resources`` placing each stage (``docs/rl/multinode.md``).
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from typing import Any

from nobubble.distributed import looks_like_peer_failure
from nobubble.rl.system.config import RunConfig
from nobubble.rl.system.engines.worker import (
    Engine,
    Message,
    StageWorker,
    WorkerError,
    learner_names,
    learner_rank,
)
from nobubble.rl.system.learner import pushes_gradients
from nobubble.rl.system.weight_sync import check_newer

__all__ = ["RayEngine", "check_ray_address", "start_local_ray"]


class _ObjectStoreWeights:
    """A Ray call's weight source: the published ``version`` and its state dict's reference
    the driver sent with the call (None: none), and the object store learner 0 publishes to."""

    def __init__(self, version: int | None = None, ref: Any = None) -> None:
        self.version, self.ref = version, ref

    def pull(self, model: Any, have: int) -> int:
        import ray

        if self.version is None or self.version == have:
            return have
        check_newer(have, self.version, "a Ray call's weights")
        model.load_state_dict(ray.get(self.ref))
        return self.version

    def publish(self, model: Any, version: int) -> tuple[int, Any]:
        import ray

        return version, ray.put(model.state_dict())


class _StageActor(StageWorker):
    """Actor body: a StageWorker that also knows its node and where the learners meet."""

    def learner_address(self, on_cluster: bool) -> tuple[str, int]:
        """Where the learners' group meets: a free port on this actor's host."""
        import ray

        host = ray.util.get_node_ip_address() if on_cluster else "127.0.0.1"
        with socket.create_server((host, 0)) as sock:
            return host, sock.getsockname()[1]

    def ready_on_node(self) -> list[Message]:
        """Ready, with the node this actor runs on: ``(node id, node address)``."""
        import ray

        node = (ray.get_runtime_context().get_node_id(), ray.util.get_node_ip_address())
        return [self.ready(_ObjectStoreWeights(), node)]


class RayEngine(Engine):
    """Stage workers as Ray actors (see the module docstring)."""

    def __init__(self) -> None:
        super().__init__()
        # worker -> (node id, node address) it runs on, as it says ready (a restart replaces it)
        self.placement: dict[str, tuple[str, str]] = {}
        self._actors: dict[str, Any] = {}
        self._pending: dict[Any, str] = {}
        self._started_ray = False
        self._sent: dict[str, int] = {}  # worker -> the version its actor was last sent
        self._errors: list[WorkerError] = []
        self._starting: set[str] = set()  # spawned, not ready yet

    def _start(self, cfg: RunConfig, names: list[str]) -> None:
        """Start or join Ray, and refuse a run the cluster's live nodes cannot hold (an
        actor Ray cannot place would wait forever)."""
        import ray

        if cfg.ray_address:  # probed even when Ray is up: the user named this cluster
            check_ray_address(cfg.ray_address)  # ray.init would wait minutes for a GCS
        need = cfg.num_rollout_workers + cfg.learners  # one logical CPU each
        if not ray.is_initialized():
            if cfg.ray_address:
                with _loopback_stays_loopback(cfg.ray_address):
                    ray.init(address=cfg.ray_address, log_to_driver=False)
            else:
                start_local_ray(num_cpus=max(os.cpu_count() or 2, need))
            self._started_ray = True
        have = ray.cluster_resources()
        if have.get("CPU", 0) < need:
            raise ValueError(
                f"{cfg.num_rollout_workers} generators + {cfg.learners} learners need {need} "
                f"CPUs of Ray, the cluster has {have.get('CPU', 0):g}; start Ray with "
                f"num_cpus >= {need} or use fewer generators / learners"
            )
        for stage in cfg.ray_resources:
            short = _shortfall(cfg, stage, names, have)
            if short:
                raise ValueError(f"ray_resources[{stage!r}]: {short}")

    def _check_placeable(self) -> None:
        """Raise for a worker waiting to start whose stage's resources no live node offers any
        more (its node died, say): it will never start."""
        import ray

        assert self._cfg is not None  # set by start()
        cfg, have = self._cfg, ray.cluster_resources()  # live nodes only
        for worker in sorted(self._starting):
            short = _shortfall(cfg, _stage(worker), list(self._actors), have)
            if short:  # worker=None: no restart could place it either
                gone = f" (it ran on {self._where(worker)})" if worker in self.placement else ""
                raise WorkerError(f"{worker} cannot start{gone}: {short}")

    def _join_learners(self, cfg: RunConfig) -> None:
        """Every learner actor joins the gloo group learner 0 chose (bounded waits)."""
        where = self._actors["trainer"].learner_address.remote(bool(cfg.ray_address))
        host, port = self._get(where, "trainer", "failed to start", cfg.stall_timeout_s)
        names = learner_names(cfg.learners)
        joins = {n: self._actors[n].join_learners.remote(host, port) for n in names}
        for name, ref in joins.items():
            self._get(ref, name, "failed to join the learners", cfg.stall_timeout_s)

    def _get(self, ref: Any, worker: str, what: str, timeout_s: float) -> Any:
        """``ray.get(ref)``; its failure (RayActorError, RayTaskError, GetTimeoutError) raises
        as ``worker``'s :class:`WorkerError` (``"<worker> <what>: ..."``)."""
        import ray

        try:
            return ray.get(ref, timeout=timeout_s)
        except Exception as err:
            on = f" on {self._where(worker)}" if worker in self.placement else ""
            msg = f"{worker} {what}{on}: {type(err).__name__}: {err}"
            raise WorkerError(msg, worker) from err

    def _collect(self, refs: list[Any], timeout_s: float) -> list[Message]:
        """The answers of the finished calls ``refs``; a failed call's error is held back."""
        out: list[Message] = []
        for ref in refs:
            name = self._pending.pop(ref)
            try:
                out += self._get(ref, name, "failed", timeout_s)
            except WorkerError as err:
                self._errors.append(err)
        return out

    def _launch(self, name: str, incarnation: int) -> None:
        import ray

        assert self._cfg is not None  # set by start()
        # reward workers mostly wait on verifiers: they take no CPU slot of their own
        cpus = 0 if name.startswith("reward") else 1
        resources = self._cfg.ray_resources.get(_stage(name), {})
        opts = {"num_cpus": cpus, "resources": resources, "max_restarts": 0, "name": None}
        # Any: Ray's actor-proxy types do not give undecorated methods a ``.remote``
        actor: Any = ray.remote(_StageActor).options(**opts).remote(name, self._cfg, incarnation)
        self._actors[name] = actor
        self._pending[actor.ready_on_node.remote()] = name
        self._starting.add(name)

    def _stop(self, worker: str) -> None:
        """Kill ``worker``'s actor and forget its pending calls."""
        import ray

        with suppress(Exception):  # an actor that already died is fine
            ray.kill(self._actors.pop(worker))
        self._pending = {r: w for r, w in self._pending.items() if w != worker}
        self._sent.pop(worker, None)  # a fresh actor holds no published weights

    def _send(self, worker: str, cmd: tuple) -> None:
        """``cmd`` to ``worker``'s actor, with the newest published weights if not sent it yet
        and it pulls them: a generator, or a learner that pushes gradients (an actor runs its
        calls in order, so it holds them by then)."""
        assert self._cfg is not None  # set by start()
        version, ref = None, None
        pushes = cmd[0] == "train" and pushes_gradients(learner_rank(worker), self._cfg.aggregation)
        if cmd[0] == "rollout" or pushes:
            assert self._weights is not None  # set when learner 0 said ready
            if self._sent.get(worker) != self._weights[0]:
                version, ref = self._weights
                self._sent[worker] = version
        call = self._actors[worker].handle.remote(cmd, _ObjectStoreWeights(version, ref))
        self._pending[call] = worker

    def _receive(self, timeout_s: float) -> list[Message]:
        import ray

        if self._errors or not self._pending:  # an error held back from the last poll first
            return []
        refs = list(self._pending)
        done, _ = ray.wait(refs, num_returns=1, timeout=timeout_s)
        if done:  # and all others that are ready
            done, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
        elif self._starting:
            self._check_placeable()
        out = self._collect(done, timeout_s=60)
        for m in out:
            if m.kind == "ready":
                self.placement[m.worker] = m.payload
                self._starting.discard(m.worker)
        if self._errors:
            self._blame_peers()
        return out

    def _failure(self) -> WorkerError | None:
        return self._errors.pop(0) if self._errors else None

    def _blame_peers(self, grace_s: float = 2.0) -> None:
        """A learner that failed because a peer learner died goes behind the peer's error
        (waiting ``grace_s`` for the other learners' calls to fail too)."""
        import ray

        first = self._errors[0]
        peer = (first.worker or "").startswith("trainer") and looks_like_peer_failure(str(first))
        if not peer:
            return
        refs = [r for r, w in self._pending.items() if w.startswith("trainer")]
        done, _ = ray.wait(refs, num_returns=len(refs), timeout=grace_s) if refs else ([], [])
        self._collect(done, grace_s)
        self._errors.sort(key=lambda e: looks_like_peer_failure(str(e)))

    def _where(self, worker: str) -> str:
        node = self.placement.get(worker)
        return "an unknown node" if node is None else f"node {node[0]} ({node[1]})"

    def shutdown(self) -> None:
        import ray

        for worker in list(self._actors):
            self._stop(worker)
        self._starting.clear()
        if self._started_ray:
            ray.shutdown()
            self._started_ray = False


def start_local_ray(num_cpus: int) -> None:
    """Start a new Ray on this machine, on 127.0.0.1 only, no dashboard, workers' output not
    echoed: the engine's when no cluster is named, and the one a test run shares."""
    import ray

    with _loopback_stays_loopback(None):
        ray.init(
            address="local",  # a new instance, not the latest `ray start` on this machine
            num_cpus=num_cpus,
            include_dashboard=False,
            log_to_driver=False,
            _node_ip_address="127.0.0.1",
        )


def _stage(worker: str) -> str:
    """``rollout-1`` -> ``rollout``, ``trainer-2`` -> ``trainer``: the key of ray_resources."""
    return worker.split("-")[0]


def _shortfall(cfg: RunConfig, stage: str, names: list[str], have: dict[str, float]) -> str | None:
    """What the actors of ``stage`` among ``names`` lack of ``cfg.ray_resources[stage]`` on
    the live nodes (``have``: ``ray.cluster_resources()``), or None when they hold them."""
    count = sum(_stage(n) == stage for n in names)
    for resource, amount in cfg.ray_resources.get(stage, {}).items():
        if have.get(resource, 0) < count * amount:
            return (
                f"{count} {stage} actors x {amount:g} {resource!r} need {count * amount:g}, "
                f"the cluster's live nodes offer {have.get(resource, 0):g}; start nodes with "
                f"`ray start --resources '{{\"{resource}\": N}}'` or ask for less"
            )
    return None


@contextmanager
def _loopback_stays_loopback(address: str | None) -> Iterator[None]:
    """While ``ray.init`` runs: keep 127.0.0.1 (a Ray started here, or the host of ``address``)
    from being replaced by the machine's outward address, by turning
    ``ray_constants.ENABLE_RAY_CLUSTER`` off (ray-project/ray#26293, #59110)."""
    from ray._private import ray_constants

    host = None if address is None else address.rpartition(":")[0].strip("[]")
    pin = host in (None, "127.0.0.1", "localhost", "::1")
    saved = getattr(ray_constants, "ENABLE_RAY_CLUSTER", None)
    if pin and saved is not None:
        ray_constants.ENABLE_RAY_CLUSTER = False
    try:
        yield
    finally:
        if pin and saved is not None:
            ray_constants.ENABLE_RAY_CLUSTER = saved


def check_ray_address(address: str, timeout_s: float = 5.0) -> None:
    """Refuse, within ``timeout_s``, a ``HOST:PORT`` cluster address where no Ray GCS answers:
    ``ray.init`` itself waits minutes. The GCS speaks gRPC, so it answers an HTTP/2 client
    preface with a SETTINGS frame; nothing listening, or a listener that says nothing (or
    something else), is refused. Other forms (``auto``, ``ray://...``) are left to Ray."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit() or "://" in address:
        return
    preface = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])
    host = host.strip("[]") or "127.0.0.1"  # [::1]:6379
    try:
        with socket.create_connection((host, int(port)), timeout=timeout_s) as c:
            c.sendall(preface)
            with c.makefile("rb") as answer:
                frame = answer.read(4)  # a frame header: 3 bytes length, 1 type (4: SETTINGS)
        reason = None if len(frame) >= 4 and frame[3] == 4 else "it does not speak gRPC"
    except OSError as err:
        reason = "no answer" if isinstance(err, TimeoutError) else (err.strerror or str(err))
    if reason is not None:
        raise WorkerError(
            f"--address {address}: no Ray cluster answers there within {timeout_s:g}s "
            f"({reason}); start one with `ray start --head`, or drop --address"
        )
