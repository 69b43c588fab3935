"""A small reference reward server, for tests, demos and as a template for a real one.

It speaks the wire format of :mod:`nobubble.rl.system.rewards.remote`::

    POST .../score   {"prompts": [...], "responses": [...]}
    200              {"rewards": [reward_fn(p, r) for p, r in pairs]}

Other answers: 400 ``{"error": "..."}`` for a body that is not that JSON object (two lists of
strings of one length); 404 for a path that does not end in ``/score``; 500
``{"error": "..."}`` when ``reward_fn`` raises or returns something that is not a finite
number (so a broken verifier surfaces as a failed request, never as a score). Every answer
has ``Content-Type: application/json``.

For failure experiments :func:`serve_rewards` can delay every answer (``delay_s``, to
provoke client timeouts), fail every request (``fail_status``) or fail the first few
(``fail_first``). From a shell::

    nobubble rl reward-server --reward my_pkg.verify:score --port 8000
    nobubble rl reward-server --task digits

prints the url once and serves until Ctrl-C.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, cast

from nobubble.rl.system.rewards.remote import check_pairs
from nobubble.rl.system.tasks.spec import as_reward
from nobubble.validation import check_value

__all__ = ["RewardServer", "serve_rewards"]

RewardFn = Callable[[str, str], float]

_CLOSE_TIMEOUT_S = 5.0
_POLL_INTERVAL_S = 0.02  # how soon serve_forever notices close(); the default 0.5 s slows tests


class RewardServer(ThreadingHTTPServer):
    """Serve ``reward_fn(prompt, response) -> float`` at ``http://host:port/score`` from a
    daemon thread; :func:`serve_rewards` is another name for it.

    Lifecycle: serving from construction until :meth:`close` (or the end of a ``with``
    block); ``close`` is idempotent.

    Args:
        reward_fn: scores one pair; any finite real.
        host, port: where to listen; ``port=0`` picks a free port (read it from ``url``).
        delay_s: seconds to sleep before answering each request, >= 0.
        fail_status: answer every request with this status (e.g. 500); None = behave.
        fail_first: answer the first ``fail_first`` requests with 500, then behave.

    Attributes:
        url: the scoring endpoint, e.g. ``http://127.0.0.1:54321/score``.
    """

    def __init__(
        self,
        reward_fn: RewardFn,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        delay_s: float = 0.0,
        fail_status: int | None = None,
        fail_first: int = 0,
    ) -> None:
        check_value("serve_rewards delay_s", delay_s, ">= 0")
        check_value("serve_rewards fail_first", fail_first, ">= 0", integer=True)
        if fail_status is not None and not (
            isinstance(fail_status, int) and 400 <= fail_status <= 599
        ):
            raise ValueError(
                f"serve_rewards fail_status={fail_status!r} must be an HTTP error status in "
                "[400, 599] (e.g. 500) or None"
            )
        if not callable(reward_fn):
            raise ValueError(f"serve_rewards reward_fn={reward_fn!r} is not callable")
        self.reward_fn = reward_fn
        self.delay_s = delay_s
        self.fail_status = fail_status
        self.fail_first = fail_first
        self._lock = threading.Lock()
        self._num_requests = 0
        super().__init__((host, port), _Handler)
        bound_host, bound_port = self.server_address[:2]
        self.url = f"http://{bound_host!s}:{bound_port}/score"
        self._closed = False
        self._serving = threading.Thread(
            target=self.serve_forever,
            kwargs={"poll_interval": _POLL_INTERVAL_S},
            name="reward-server",
            daemon=True,
        )
        self._serving.start()

    @property
    def requests(self) -> int:
        """POST requests received so far (any path, any outcome)."""
        with self._lock:
            return self._num_requests

    def _next_request_index(self) -> int:
        """Count one request; its 0-based index decides whether ``fail_first`` applies."""
        with self._lock:
            self._num_requests += 1
            return self._num_requests - 1

    def close(self) -> None:
        """Stop serving and release the port; waits up to 5 s for the serving thread."""
        if self._closed:
            return
        self._closed = True
        self.shutdown()
        self.server_close()
        self._serving.join(timeout=_CLOSE_TIMEOUT_S)

    def __exit__(self, *args: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"RewardServer(url={self.url!r}, requests={self.requests})"

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client that timed out and hung up is expected in failure experiments.
        if isinstance(sys.exc_info()[1], ConnectionError):
            return
        super().handle_error(request, client_address)


serve_rewards = RewardServer
"""Start a :class:`RewardServer`: ``serve_rewards(reward_fn, *, host, port, delay_s,
fail_status, fail_first)``."""


class _Handler(BaseHTTPRequestHandler):
    server_version = "nobubble-reward/1"

    def log_message(self, format: str, *args: Any) -> None:
        pass  # silence the per-request line on stderr

    def do_POST(self) -> None:
        owner = cast(RewardServer, self.server)
        index = owner._next_request_index()
        body = self._read_body()
        if owner.delay_s:
            time.sleep(owner.delay_s)
        if owner.fail_status is not None:
            return self._answer(owner.fail_status, {"error": f"fail_status={owner.fail_status}"})
        if index < owner.fail_first:
            return self._answer(
                500, {"error": f"fail_first={owner.fail_first}: request {index} fails"}
            )
        if not self.path.split("?", 1)[0].endswith("/score"):
            return self._answer(404, {"error": f"no endpoint {self.path!r}; POST to /score"})
        try:
            prompts, responses = _parse_request(body)
        except ValueError as err:
            return self._answer(400, {"error": str(err)})
        try:
            pairs = enumerate(zip(prompts, responses))
            rewards = [
                as_reward(owner.reward_fn(p, r), f"reward_fn for pair {i}") for i, (p, r) in pairs
            ]
        except Exception as err:  # a broken verifier: report it, never score it
            return self._answer(500, {"error": f"reward_fn failed: {type(err).__name__}: {err}"})
        self._answer(200, {"rewards": rewards})

    def _read_body(self) -> bytes:
        try:
            length = int(self.headers.get("Content-Length", "0"))
        except ValueError:
            length = 0
        return self.rfile.read(length) if length > 0 else b""

    def _answer(self, status: int, payload: dict[str, Any]) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


def _parse_request(body: bytes) -> tuple[list[str], list[str]]:
    """``(prompts, responses)`` of a request body; ValueError names what is wrong."""
    try:
        payload = json.loads(body)
    except ValueError:
        raise ValueError('body is not JSON; send {"prompts": [...], "responses": [...]}') from None
    if not isinstance(payload, dict):
        raise ValueError('body must be a JSON object {"prompts": [...], "responses": [...]}')
    check_pairs(payload.get("prompts"), payload.get("responses"))
    return payload["prompts"], payload["responses"]
