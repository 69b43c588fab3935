"""A reference reward server speaking :mod:`.remote`'s wire format: for tests, demos, and as
a template for a real one.

Answers, all JSON: 200 ``{"rewards": [reward_fn(p, r) for p, r in pairs]}``; 400
``{"error": ...}`` for a body that is not an object of two lists of strings of one length;
404 for a path that does not end in ``/score``; 500 ``{"error": ...}`` when ``reward_fn``
raises or returns a value that is not a finite number (a broken verifier fails the request,
it never scores). From a shell, ``nobubble rl reward-server --reward my_pkg.verify:score``
(or ``--task digits``) prints the url and serves until Ctrl-C.
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
from nobubble.rl.system.tasks import as_reward
from nobubble.validation import check_value

__all__ = ["RewardServer", "serve_rewards"]

_CLOSE_TIMEOUT_S = 5.0
_POLL_INTERVAL_S = 0.02  # how soon serve_forever notices close(); the default 0.5 s slows tests


class RewardServer(ThreadingHTTPServer):
    """Serve ``reward_fn(prompt, response) -> float`` at ``url`` (``http://host:port/score``)
    from a daemon thread, from construction until :meth:`close` (idempotent; waits up to 5 s
    for the thread) or the end of a ``with`` block.

    Args:
        reward_fn: scores one pair; any finite real.
        host, port: where to listen; ``port=0`` picks a free port (read it from ``url``).
        delay_s: seconds to sleep before answering each request, >= 0 (provokes timeouts).
        fail_status: answer every request with this status in [400, 599]; None = behave.
        fail_first: answer the first ``fail_first`` requests with 500, then behave.

    ``requests`` counts the POST requests received (any path, any outcome).
    """

    def __init__(
        self,
        reward_fn: Callable[[str, str], float],
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
        self.reward_fn, self.delay_s = reward_fn, delay_s
        self.fail_status, self.fail_first = fail_status, fail_first
        self.requests = 0
        self._lock = threading.Lock()
        super().__init__((host, port), _Handler)
        self.url = f"http://{self.server_address[0]!s}:{self.server_address[1]}/score"
        self._closed = False
        self._serving = threading.Thread(
            target=self.serve_forever,
            kwargs={"poll_interval": _POLL_INTERVAL_S},
            name="reward-server",
            daemon=True,
        )
        self._serving.start()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self.shutdown()
        self.server_close()
        self._serving.join(timeout=_CLOSE_TIMEOUT_S)

    def __exit__(self, *args: object) -> None:
        self.close()

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client that timed out and hung up is expected in failure experiments.
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)

    def answer(self, index: int, path: str, body: bytes) -> tuple[int, dict[str, Any]]:
        """The status and JSON payload for request number ``index`` (from 0)."""
        if self.fail_status is not None:
            return self.fail_status, {"error": f"fail_status={self.fail_status}"}
        if index < self.fail_first:
            return 500, {"error": f"fail_first={self.fail_first}: request {index} fails"}
        if not path.split("?", 1)[0].endswith("/score"):
            return 404, {"error": f"no endpoint {path!r}; POST to /score"}
        try:
            payload = json.loads(body)
            if not isinstance(payload, dict):
                raise ValueError("not a JSON object")
            check_pairs(payload.get("prompts"), payload.get("responses"))
        except ValueError as err:  # JSONDecodeError and UnicodeDecodeError too
            return 400, {
                "error": f'bad body ({err}); send {{"prompts": [...], "responses": [...]}}'
            }
        try:
            rewards = [
                as_reward(self.reward_fn(p, r), f"reward_fn for pair {i}")
                for i, (p, r) in enumerate(zip(payload["prompts"], payload["responses"]))
            ]
        except Exception as err:  # a broken verifier: report it, never score it
            return 500, {"error": f"reward_fn failed: {type(err).__name__}: {err}"}
        return 200, {"rewards": rewards}


serve_rewards = RewardServer  # the function-style name: serve_rewards(reward_fn, **settings)


class _Handler(BaseHTTPRequestHandler):
    server_version = "nobubble-reward/1"

    def log_message(self, format: str, *args: Any) -> None:
        pass  # silence the per-request line on stderr

    def do_POST(self) -> None:
        owner = cast(RewardServer, self.server)
        with owner._lock:
            index, owner.requests = owner.requests, owner.requests + 1
        length = self.headers.get("Content-Length", "0")
        body = self.rfile.read(int(length)) if length.isdigit() else b""
        if owner.delay_s:
            time.sleep(owner.delay_s)
        status, payload = owner.answer(index, self.path, body)
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
