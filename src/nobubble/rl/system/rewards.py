"""The reward stage (:class:`Rewarder`, :class:`RewardWatch`), the client of a reward service
(:class:`RemoteReward`) and a reference server of its wire format (:class:`RewardServer`,
``docs/rl/own-model.md``): a reward that fails is recorded, never scored 0 in silence.
"""

from __future__ import annotations

import functools
import http.client
import inspect
import json
import random
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any, cast
from urllib.parse import urlsplit

from nobubble.imports import is_import_path, load_user_object
from nobubble.rl.system.tasks import TaskSpec, as_reward
from nobubble.rl.system.types import Sample, SampleGroup, Span
from nobubble.validation import check_value, finite

if TYPE_CHECKING:
    from nobubble.rl.system.config import RewardConfig

__all__ = [
    "RewardFailure",
    "RewardWatch",
    "check_reward_fn",
    "RewardSource",
    "parse_reward",
    "Rewarder",
    "RemoteReward",
    "RewardServer",
]

_EXCERPT_CHARS = 200  # how much of a bad answer an error message quotes
_CLOSE_TIMEOUT_S = 5.0
_POLL_INTERVAL_S = 0.02  # how soon serve_forever notices close(); the default 0.5 s slows tests

RewardFn = Callable[[str, str], float]


class RewardFailure(RuntimeError):
    """A reward gave no valid score: a failure injected by ``RewardConfig.failure_rate``, a
    reward service that failed (``retry``: one attempt of it, which another may fix; False
    on the final failures), or so many groups in a row that the run cannot learn
    (:class:`RewardWatch`)."""

    def __init__(self, message: str, retry: bool = False) -> None:
        super().__init__(message)
        self.retry = retry


class RewardWatch:
    """:meth:`record` raises :class:`RewardFailure` once ``give_up_groups`` groups in a row
    failed, or the streak lasted ``give_up_s`` seconds (from its first group's ``t_admitted``)."""

    def __init__(self, cfg: RewardConfig, source: str) -> None:
        self.cfg, self.source = cfg, source
        self.streak = 0
        self._since = 0.0  # wall-clock start of the current streak

    def record(self, group: SampleGroup) -> None:
        if not group.reward_failed:
            self.streak = 0
            return
        now = time.time()
        if self.streak == 0:
            self._since = group.t_admitted if 0 < group.t_admitted <= now else now
        self.streak += 1
        if self.streak >= self.cfg.give_up_groups or now - self._since >= self.cfg.give_up_s:
            error = next(s.reward_error for s in group.samples if s.reward_failed)
            raise RewardFailure(
                f"reward {self.source}: all of the last {self.streak} groups failed, "
                f"{now - self._since:.0f}s without a scored one; last error: {error}"
            )


def check_reward_fn(fn: Any, name: str) -> None:
    """Refuse a reward that cannot be called as ``fn(prompt, response)`` (ValueError)."""
    if not callable(fn):
        raise ValueError(f"reward {name!r} is not callable; name a function")
    try:
        inspect.signature(fn).bind("prompt", "response")
    except TypeError as err:
        raise ValueError(f"reward {name!r} must take (prompt, response): {err}") from None
    except ValueError:
        pass  # a builtin without a signature: judged when called


@dataclass(frozen=True)
class RewardSource:
    """One weighted term of the reward: ``weight * fn(prompt, response)``; ``fn`` is
    ``"task"`` (the task's reward), an import path, or a picklable callable."""

    fn: str | RewardFn = "task"
    weight: float = 1.0

    def __post_init__(self) -> None:
        if not finite(self.weight):
            raise ValueError(f"reward weight {self.weight} must be a finite number")
        if isinstance(self.fn, str) and self.fn != "task" and not is_import_path(self.fn):
            raise ValueError(f"reward {self.fn!r} is neither 'task' nor an import path 'module:fn'")
        if self.fn != "task":
            check_reward_fn(self.resolve(None), str(getattr(self.fn, "__name__", self.fn)))

    def resolve(self, task: TaskSpec | None) -> RewardFn:
        if self.fn == "task":
            assert task is not None
            return task.task.reward
        return (
            load_user_object("--reward", self.fn, "reward") if isinstance(self.fn, str) else self.fn
        )


def parse_reward(text: str) -> RewardSource:
    """``"module:fn"``, ``"module:fn=0.5"``, ``"task"`` or ``"task=2"`` as a source."""
    fn, sep, weight = text.rpartition("=")
    if not sep:
        return RewardSource(text)
    try:
        w = float(weight)
    except ValueError:
        raise ValueError(f"reward {text!r}: weight {weight!r} is not a number") from None
    return RewardSource(fn, w)


class Rewarder:
    """Scores a sample as ``sum(weight * fn(prompt, response))`` over ``sources`` (empty:
    ``("task", 1.0)`` unless ``remote`` is set) plus ``remote``'s score (``.score(prompts,
    responses) -> (rewards, retries)``, one call a group), every value a finite real; ``cfg``
    gives delays, injected failures (seeded by sample id and attempt) and retries."""

    def __init__(
        self,
        task: TaskSpec,
        sources: tuple[RewardSource, ...],
        cfg: RewardConfig,
        remote: Any = None,
    ) -> None:
        if not sources and remote is None:
            sources = (RewardSource(),)
        self.cfg = cfg
        self.remote = remote
        self._fns = [(s.resolve(task), s.weight, str(s.fn)) for s in sources]

    def _attempt(self, s: Sample, attempt: int) -> float:
        cfg = self.cfg
        if cfg.delay_s:
            time.sleep(cfg.delay_s)
        if cfg.failure_rate and (  # no draw at a failure rate of 0
            random.Random(hash((cfg.seed, s.sample_id, attempt))).random() < cfg.failure_rate
        ):
            raise RewardFailure(f"injected failure (sample {s.sample_id}, attempt {attempt})")
        return sum(w * as_reward(fn(s.prompt, s.response), name) for fn, w, name in self._fns)

    def _score(self, s: Sample) -> tuple[float | None, str | None, int]:
        """``(reward, None, retries)``, or ``(None, last error, retries)`` when every
        attempt raised."""
        error = ""
        for attempt in range(self.cfg.max_retries + 1):
            try:
                return self._attempt(s, attempt), None, attempt
            except Exception as err:  # noqa: BLE001 - any verifier failure is recorded
                error = f"{type(err).__name__}: {err} (after {self.cfg.max_retries} retries)"
        return None, error, self.cfg.max_retries

    def score_group(self, group: SampleGroup) -> tuple[SampleGroup, Span]:
        """The group with every sample scored or failed (``reward_error`` = the last error;
        a remote failure fails every sample), and the busy span."""
        start = time.time()
        scores = [self._score(s) for s in group.samples]
        retries = sum(r for _, _, r in scores)
        if self.remote is not None:
            try:
                remote, used = self.remote.score(
                    [s.prompt for s in group.samples], [s.response for s in group.samples]
                )
                retries += used
                scores = [(v if v is None else v + r, e, 0) for (v, e, _), r in zip(scores, remote)]
            except Exception as err:  # noqa: BLE001 - the service's failure is recorded
                scores = [(None, e or f"{type(err).__name__}: {err}", 0) for _, e, _ in scores]
        now = time.time()
        out = tuple(
            s.scored(v, now) if v is not None else s.failed(str(e), now)
            for s, (v, e, _) in zip(group.samples, scores)
        )
        failed = sum(s.reward_failed for s in out)
        info = {"group": group.group_id, "retries": retries, "failed": failed}
        span = Span("reward", f"reward g{group.group_id}", start, now, info)
        return group.with_samples(out), span


@dataclass(frozen=True)
class RemoteReward:
    """Scores ``(prompt, response)`` pairs at ``url`` (``http(s)://`` with a host), one batched
    POST a call. An attempt fails on a connection error, a timeout (``timeout_s`` per socket
    operation), a status >= 500 or a malformed answer, and is retried up to ``max_retries``
    times, sleeping ``backoff_s * 2**(a - 1)`` (through ``sleep``) before attempt ``a``; a 4xx
    is not retried. A made-up score is never returned."""

    url: str
    timeout_s: float = 10.0
    max_retries: int = 2
    backoff_s: float = 0.05
    sleep: Callable[[float], None] = field(default=time.sleep, repr=False, compare=False)

    def __post_init__(self) -> None:
        try:
            parts = urlsplit(self.url)
            parts.port  # noqa: B018 - raises ValueError on a port that is not a number
        except (AttributeError, TypeError, ValueError):
            parts = None
        if parts is None or parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(
                f"RemoteReward.url={self.url!r} must be an http:// or https:// URL with a host, "
                "e.g. 'http://127.0.0.1:8000/score'"
            )
        check_value("RemoteReward.timeout_s", self.timeout_s, "> 0")
        check_value("RemoteReward.max_retries", self.max_retries, ">= 0", integer=True)
        check_value("RemoteReward.backoff_s", self.backoff_s, ">= 0")

    def score(self, prompts: list[str], responses: list[str]) -> tuple[list[float], int]:
        """``(rewards, num_retries)`` for ``B`` prompts and their responses (``[]`` for none,
        asked of no one). Raises ValueError on a malformed batch, :class:`RewardFailure`
        naming the url, the attempts and the last error when no attempt got a valid answer."""
        check_pairs(prompts, responses)
        if not prompts:
            return [], 0
        body = json.dumps({"prompts": list(prompts), "responses": list(responses)}).encode()
        last_error = ""
        for attempt in range(self.max_retries + 1):
            if attempt:
                self.sleep(self.backoff_s * 2 ** (attempt - 1))
            try:
                return _parse_rewards(_post(self.url, body, self.timeout_s), len(prompts)), attempt
            except RewardFailure as err:
                if not err.retry:
                    raise RewardFailure(
                        f"reward service {self.url} refused the request after "
                        f"{_attempts(attempt + 1)} ({err}); a status < 500 is not retried: "
                        "check the url's path and what the server expects"
                    ) from None
                last_error = str(err)
        raise RewardFailure(
            f"reward service {self.url} gave no valid answer in "
            f"{_attempts(self.max_retries + 1)}; last error: {last_error}"
        )


def check_pairs(prompts: Any, responses: Any) -> None:
    """Raise ValueError unless ``prompts`` and ``responses`` are lists of strings of one length."""
    for name, items in (("prompts", prompts), ("responses", responses)):
        if not isinstance(items, list | tuple):
            raise ValueError(f"{name}={items!r:.100} is not a list; send a list of strings")
        for i, item in enumerate(items):
            if not isinstance(item, str):
                raise ValueError(
                    f"{name}[{i}]={item!r:.100} is a {type(item).__name__}; "
                    "pass strings (decode token ids first)"
                )
    if len(prompts) != len(responses):
        raise ValueError(
            f"{len(prompts)} prompts and {len(responses)} responses; pass one response per prompt"
        )


def _post(url: str, body: bytes, timeout_s: float) -> bytes:
    """The body of a 2xx answer to ``POST url``, else :class:`RewardFailure`."""
    headers = {"Content-Type": "application/json", "Accept": "application/json"}
    request = urllib.request.Request(url, data=body, method="POST", headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            return response.read()
    except urllib.error.HTTPError as err:  # before OSError: it subclasses it
        try:
            detail = _excerpt(err.read())
        except (http.client.HTTPException, OSError):
            detail = ""
        message = f"HTTP {err.code}" + (f": {detail}" if detail else "")
        raise RewardFailure(message, retry=err.code >= 500) from None
    except (http.client.HTTPException, OSError) as err:  # URLError and TimeoutError too
        reason = err.reason if isinstance(err, urllib.error.URLError) else err
        if isinstance(reason, TimeoutError):
            raise RewardFailure(f"timed out after {timeout_s}s", retry=True) from None
        raise RewardFailure(f"connection failed: {reason!r}", retry=True) from None


def _parse_rewards(raw: bytes, num_pairs: int) -> list[float]:
    """The ``num_pairs`` finite rewards in a ``{"rewards": [...]}`` body."""
    try:
        values = json.loads(raw)["rewards"]
    except (ValueError, TypeError, KeyError, IndexError):  # JSONDecodeError, UnicodeDecodeError
        values = None
    if not isinstance(values, list):
        raise RewardFailure(
            f"malformed answer (no JSON 'rewards' list): {_excerpt(raw)!r}", retry=True
        )
    if len(values) != num_pairs:
        raise RewardFailure(
            f"malformed answer: {len(values)} rewards for {num_pairs} prompt/response pairs",
            retry=True,
        )
    try:
        return [as_reward(value, f"the service for pair {i}") for i, value in enumerate(values)]
    except ValueError as err:
        raise RewardFailure(f"malformed answer: {err}", retry=True) from None


def _excerpt(raw: bytes) -> str:
    text = raw.decode("utf-8", errors="replace").strip()
    return text if len(text) <= _EXCERPT_CHARS else text[:_EXCERPT_CHARS] + "..."


def _attempts(count: int) -> str:
    return f"{count} attempt" + ("s" if count != 1 else "")


class RewardServer(ThreadingHTTPServer):
    """The reference server of the wire format (``docs/rl/own-model.md``: 200, 400, 404, 500
    with a JSON error): serves ``reward_fn(prompt, response) -> float`` at ``url``
    (``http://host:port/score``; ``port=0`` picks a free port) from a daemon thread until
    :meth:`close` (idempotent, waits up to 5 s) or the end of a ``with`` block. Failure
    injection: sleep ``delay_s`` before each answer, answer every request with
    ``fail_status`` (400..599), or the first ``fail_first`` with 500. ``requests`` counts the
    POST requests received."""

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
        check_value("RewardServer delay_s", delay_s, ">= 0")
        check_value("RewardServer fail_first", fail_first, ">= 0", integer=True)
        if fail_status is not None and not (
            isinstance(fail_status, int) and 400 <= fail_status <= 599
        ):
            raise ValueError(
                f"RewardServer fail_status={fail_status!r} must be an HTTP error status in "
                "[400, 599] (e.g. 500) or None"
            )
        check_reward_fn(reward_fn, "RewardServer reward_fn")
        self.reward_fn, self.delay_s = reward_fn, delay_s
        self.fail_status, self.fail_first = fail_status, fail_first
        self.requests = 0
        self._lock = threading.Lock()
        super().__init__((host, port), _Handler)
        self.url = f"http://{self.server_address[0]!s}:{self.server_address[1]}/score"
        serve = functools.partial(self.serve_forever, poll_interval=_POLL_INTERVAL_S)
        self._serving = threading.Thread(target=serve, name="reward-server", daemon=True)
        self._serving.start()

    def close(self) -> None:
        self.shutdown()  # idempotent, like the two calls below
        self.server_close()
        self._serving.join(timeout=_CLOSE_TIMEOUT_S)

    def __exit__(self, *args: object) -> None:
        self.close()

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client that timed out and hung up is expected in failure experiments.
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)

    def answer(self, path: str, body: bytes) -> tuple[int, dict[str, Any]]:
        """The status and JSON payload of one request (counted, answered after ``delay_s``)."""
        with self._lock:
            index, self.requests = self.requests, self.requests + 1
        if self.delay_s:
            time.sleep(self.delay_s)
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


class _Handler(BaseHTTPRequestHandler):
    server_version = "nobubble-reward/1"

    def log_message(self, format: str, *args: Any) -> None:
        pass  # silence the per-request line on stderr

    def do_POST(self) -> None:
        length = self.headers.get("Content-Length", "0")
        body = self.rfile.read(int(length)) if length.isdigit() else b""
        status, payload = cast(RewardServer, self.server).answer(self.path, body)
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
