"""An unreachable ``--address`` fails within its timeout, naming it; a real GCS passes.

``ray.init(address=...)`` waits minutes for a GCS that never answers, so the Ray engine
probes the address first (:func:`~nobubble.rl.system.engines.ray.check_ray_address`).
Loopback only: a closed port, a listener that says nothing, and a local Ray's own GCS.
"""

from __future__ import annotations

import socket

import pytest

from nobubble.cli import main
from nobubble.distributed import WorkerError
from nobubble.rl.system.engines.ray import check_ray_address


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_nothing_listening_is_one_line_naming_the_address(capsys) -> None:
    port = _closed_port()
    argv = ["rl", "train", "--engine", "ray", "--address", f"127.0.0.1:{port}", "--steps", "2"]
    assert main(argv) == 2  # bad input: refused before any work
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"--address 127.0.0.1:{port}: no Ray cluster answers" in err[0]


def test_a_silent_listener_is_refused_within_the_timeout() -> None:
    with socket.socket() as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen()  # the kernel accepts the connection; nobody ever answers on it
        # the message names the probe's own timeout: it gave up, it did not wait for Ray's
        with pytest.raises(WorkerError, match=r"within 1s \(no answer\)"):
            check_ray_address(f"127.0.0.1:{srv.getsockname()[1]}", timeout_s=1.0)


def test_a_real_gcs_passes_the_probe(ray_session) -> None:
    check_ray_address(ray_session.get_runtime_context().gcs_address)
