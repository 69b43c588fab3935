"""Past one machine: the Ray engine on a cluster of several nodes, every one on 127.0.0.1.

A head node offers ``{"learner": 1}``, a second node ``{"generator": 1}``; the run asks
``ray_resources={"rollout": {"generator": 1}, "trainer": {"learner": 1}}``, so the generator
runs on the second node and the learner on the head, and it learns. Then the second node's
raylet is killed (SIGKILL, by its pid): the run ends with a WorkerError naming the generator
and the node; with ``restart_workers`` and a fresh generator node, the run recovers there;
with no node left that offers ``generator``, the error says so.

Loopback only: while the runs go, every socket of every process of the run (the driver,
GCS, raylets, agents, workers; the driver's process tree) is read from ``ss``: every
listening address and every peer must be 127.0.0.1 or ::1. Ray replaces 127.0.0.1 by the
machine's outward address unless told not to (see :mod:`nobubble.rl.system.engines.ray`).

Each scenario's driver is a child process (``python this_file.py <scenario> <json>``): Ray's
connection is per process, and the test run's own Ray (``ray_session``) stays up for the
other tests. The child's Ray lives under its own ``RAY_TMPDIR``, so no other ``ray.init`` on
this machine finds it, and in its own process group, which a hung child loses whole.
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.timeout(600)

PLACE = {"rollout": {"generator": 1}, "trainer": {"learner": 1}}
NODE = {"node_ip_address": "127.0.0.1", "num_cpus": 1, "object_store_memory": 100 * 2**20}
# Ray's node health check, faster than its default (3 s x 5 misses), so a killed raylet's
# node is declared dead within about 2 s
HEALTH = {"health_check_period_ms": 500, "health_check_failure_threshold": 4}
RUN = {
    "engine": "ray",
    "mode": "fully-async",
    "max_staleness": 2,
    "batch_groups": 8,
    "group_size": 32,
    "eval_every": 20,
    "timeout_s": 300,
    "stall_timeout_s": 60,
}


# -- sockets ------------------------------------------------------------------------------


def _process_tree(root: int) -> set[int]:
    """``root`` and every process below it (from /proc)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue  # gone
        parent = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(parent, []).append(int(entry.name))
    tree, todo = set(), [root]
    while todo:
        pid = todo.pop()
        tree.add(pid)
        todo += children.get(pid, [])
    return tree


def sockets(root: int) -> dict[str, list[str]]:
    """The TCP/UDP sockets of ``root``'s process tree from ``ss``: ``listen`` (``name
    address:port``) and ``peers`` (``name address``, established connections)."""
    pids = _process_tree(root)
    out: dict[str, list[str]] = {"listen": [], "peers": []}
    for key, flags in (("listen", "-ltunpH"), ("peers", "-tunpH")):
        ss = subprocess.run(["ss", flags], capture_output=True, text=True, check=True).stdout
        for line in ss.splitlines():
            owners = re.findall(r'\("([^"]*)",pid=(\d+)', line)
            names = sorted({name for name, pid in owners if int(pid) in pids})
            if names:
                fields = line.split()
                local, peer = fields[4], fields[5]
                out[key].append(f"{names[0]} {local if key == 'listen' else peer}")
    return {key: sorted(set(found)) for key, found in out.items()}


def is_loopback(address: str) -> bool:
    """``127.0.0.1:80``, ``[::ffff:127.0.0.1]:80``, ``[::1]:80``: yes; ``*:80``, ``0.0.0.0:80``,
    ``[::]:80``, another interface: no."""
    host = address.rsplit(":", 1)[0].strip("[]").split("%")[0]
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return False  # "*"
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return str(ip) in ("127.0.0.1", "::1")


def _not_loopback(seen: dict[str, list[str]]) -> list[str]:
    return [s for key in ("listen", "peers") for s in seen[key] if not is_loopback(s.split()[-1])]


# -- the child's side: the scenarios ---------------------------------------------------------


def _local() -> dict[str, Any]:
    """The engine's own Ray (no address): its sockets while the run trains."""
    from nobubble.rl import RunConfig, train

    seen: dict[str, list[str]] = {}

    def look(step: int, _: dict[str, float]) -> None:
        if step == 1:
            seen.update(sockets(os.getpid()))

    cfg = RunConfig(**{**RUN, "steps": 2, "batch_groups": 2, "group_size": 4})
    res = train(cfg, on_step=look)
    return {"steps": res.steps, "sockets": seen}


class _Cluster:
    """Learn, die, recover, strand on one cluster of nodes on 127.0.0.1 (module docstring);
    each scenario writes what it saw into ``report``."""

    def __init__(self) -> None:
        from ray.cluster_utils import Cluster

        # the head has a CPU to spare: without ray_resources, Ray could put the generator there
        head = {**NODE, "num_cpus": 2, "resources": {"learner": 1}, "include_dashboard": False}
        self.cluster = Cluster(
            initialize_head=True, head_node_args={**head, "_system_config": HEALTH}
        )
        self.nodes = {"head": self.cluster.head_node}
        self.report: dict[str, Any] = {"head": self.cluster.head_node.node_id}
        self.killed_at: float | None = None  # when the last raylet was killed

    def add_generator_node(self, name: str) -> None:
        self.nodes[name] = self.cluster.add_node(**NODE, resources={"generator": 1})
        self.report[name] = self.nodes[name].node_id

    def kill_raylet(self, name: str) -> None:
        self.killed_at = time.monotonic()
        os.kill(self.nodes[name].all_processes["raylet"][0].process.pid, signal.SIGKILL)

    def run(self, steps: int, on_step: Any = None, **more: Any) -> dict[str, Any]:
        """One run on the cluster: what it ended with (``error``: a WorkerError's text)."""
        from nobubble.distributed import WorkerError
        from nobubble.rl.system.config import RunConfig
        from nobubble.rl.system.engines.ray import RayEngine
        from nobubble.rl.system.orchestrator import Orchestrator

        engine = RayEngine()
        base = {**RUN, "ray_address": self.cluster.address, "ray_resources": PLACE}
        try:
            res = Orchestrator(
                RunConfig(**{**base, "steps": steps, **more}), engine, on_step=on_step
            ).run()
        except WorkerError as err:  # seconds since the kill: for the record, not checked
            since = None if self.killed_at is None else time.monotonic() - self.killed_at
            return {"error": str(err), "worker": err.worker, "seconds_after_kill": since}
        return {
            "steps": res.steps,
            "curve": [[p.step, p.accuracy, p.eval_return] for p in res.curve],
            "ledger_ok": res.ledger.ok,
            "restarts": res.restarts,
            "requeues": [reason for _, reason in res.requeues],
            "placement": {w: node for w, (node, _) in engine.placement.items()},
        }

    def at_step_3(self, *actions: Any) -> Any:
        def on_step(step: int, _: dict[str, float]) -> None:
            if step == 3:
                for act in actions:
                    act()

        return on_step

    def scenarios(self) -> dict[str, Any]:
        report = self.report
        self.add_generator_node("second")
        seen: dict[str, list[str]] = {}

        def look(step: int, _: dict[str, float]) -> None:
            if step == 1:
                seen.update(sockets(os.getpid()))

        report["learn"] = self.run(400, look, target_accuracy=0.5, time_budget_s=150)
        report["sockets"] = seen
        try:  # a resource no node offers is refused before any actor starts
            self.run(4, ray_resources={"rollout": {"tpu": 1}})
        except ValueError as err:
            report["refused"] = str(err)
        report["killed"] = self.run(400, self.at_step_3(lambda: self.kill_raylet("second")))
        self.add_generator_node("third")
        again = self.at_step_3(
            lambda: self.kill_raylet("third"), lambda: self.add_generator_node("fourth")
        )
        report["restarted"] = self.run(8, again, restart_workers=True)
        if "fourth" in self.nodes:  # the restart got as far as the kill
            strand = self.at_step_3(lambda: self.kill_raylet("fourth"))
            report["stranded"] = self.run(8, strand, restart_workers=True)
        return report

    def shutdown(self) -> None:
        import ray

        ray.shutdown()  # a run that failed to start may leave the driver connected
        self.cluster.shutdown()


def _cluster() -> dict[str, Any]:
    cluster = _Cluster()
    try:
        return cluster.scenarios()
    finally:
        cluster.shutdown()


# -- the tests ------------------------------------------------------------------------------


def _child(scenario: str, timeout_s: float) -> dict[str, Any]:
    """Run ``scenario`` in a child process with its own RAY_TMPDIR; its JSON report."""
    tmp = tempfile.mkdtemp(prefix="nbray-", dir="/tmp")  # short: Ray's socket paths
    out = Path(tmp) / "report.json"
    env = {**os.environ, "RAY_TMPDIR": tmp}
    cmd = [sys.executable, __file__, scenario, str(out)]
    proc = subprocess.Popen(
        cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True
    )
    try:
        log, _ = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # the child's group: its Ray with it
        log, _ = proc.communicate()
    try:
        assert proc.returncode == 0 and out.exists(), log.decode(errors="replace")[-6000:]
        return json.loads(out.read_text())
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


@pytest.mark.long  # ~12 s of a Ray of its own; the cluster tests (long) check the sockets too
def test_the_engines_own_ray_listens_and_talks_on_loopback_only():
    report = _child("local", timeout_s=240)
    assert report["steps"] == 2
    seen = report["sockets"]
    assert any(s.startswith("gcs_server ") for s in seen["listen"]), seen  # Ray was looked at
    assert any(s.startswith("raylet ") for s in seen["listen"]), seen
    assert _not_loopback(seen) == [], seen


@pytest.fixture(scope="module")
def cluster() -> dict[str, Any]:
    return _child("cluster", timeout_s=540)


@pytest.mark.long
def test_every_process_of_the_cluster_listens_and_talks_on_loopback_only(cluster):
    seen = cluster["sockets"]
    names = {s.split()[0] for s in seen["listen"]}
    assert {"gcs_server", "raylet"} <= names, seen
    # two raylets (head and second node), each with its node manager and object manager port
    assert sum(s.startswith("raylet ") for s in seen["listen"]) >= 4, seen
    assert _not_loopback(seen) == [], seen


@pytest.mark.long
def test_generators_run_on_the_second_node_the_learner_on_the_head_and_it_learns(cluster):
    learn = cluster["learn"]
    assert learn["placement"]["rollout-0"] == cluster["second"], learn
    assert learn["placement"]["trainer"] == cluster["head"], learn
    (_, acc0, reward0), (_, acc, reward) = learn["curve"][0], learn["curve"][-1]
    assert acc >= max(0.5, 2 * acc0) and reward >= 2 * reward0, learn["curve"]
    assert learn["ledger_ok"]
    assert "'tpu'" in cluster["refused"] and "live nodes offer 0" in cluster["refused"]


@pytest.mark.long
def test_a_killed_raylet_ends_the_run_naming_the_generator_and_its_node(cluster):
    killed = cluster["killed"]
    assert killed["worker"] == "rollout-0", killed
    assert killed["error"].startswith(f"rollout-0 failed on node {cluster['second']}"), killed


@pytest.mark.long
def test_restart_workers_moves_the_generator_to_a_live_node(cluster):
    again = cluster["restarted"]
    assert again.get("steps") == 8 and again["ledger_ok"], again
    assert again["restarts"][0].startswith(
        f"rollout-0: rollout-0 failed on node {cluster['third']}"
    )
    assert "worker_died" in again["requeues"], again
    assert again["placement"]["rollout-0"] == cluster["fourth"], again
    assert again["placement"]["trainer"] == cluster["head"], again
    # and with no node left that offers a generator, the error says which and why
    stranded = cluster["stranded"]["error"]
    assert stranded.startswith(f"rollout-0 cannot start (it ran on node {cluster['fourth']}"), (
        stranded
    )
    assert "live nodes offer 0" in stranded


def test_ray_resources_are_checked_when_the_config_is_built():
    from nobubble.rl import RunConfig

    RunConfig(engine="ray", ray_resources=PLACE)
    bad = [
        ({"generator": {"gpu_node": 1}}, "stage one of rollout, reward, trainer"),
        ({"rollout": {"CPU": 1}}, "give a custom resource"),
        ({"rollout": {"generator": 0}}, "a number > 0"),
    ]
    for resources, says in bad:
        with pytest.raises(ValueError, match=says):
            RunConfig(engine="ray", ray_resources=resources)
    with pytest.raises(ValueError, match="use engine='ray'"):
        RunConfig(engine="local", ray_resources=PLACE)


if __name__ == "__main__":  # the child: python test_ray_multinode.py <scenario> <report.json>
    scenario, report_path = sys.argv[1], sys.argv[2]
    found = {"local": _local, "cluster": _cluster}[scenario]()
    Path(report_path).write_text(json.dumps(found))
