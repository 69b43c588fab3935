"""A reward function that lives behind HTTP: one batched POST per call, retried, never faked.

This is the client side of a remote reward model or verifier (the shape of OpenRLHF's
``--remote_rm_url``). :class:`RemoteReward` is a picklable callable
``(prompts, responses) -> rewards``, so it can be handed to worker processes and Ray actors
like any other reward function.

Wire format (JSON over HTTP, UTF-8)::

    POST <url>                                   Content-Type: application/json
    {"prompts": ["p0", "p1", ...], "responses": ["r0", "r1", ...]}

    200 OK                                       Content-Type: application/json
    {"rewards": [0.75, -2.0, ...]}

``prompts`` and ``responses`` have the same length ``B``; ``rewards`` must have length ``B``
too, and ``rewards[i]`` scores the pair ``(prompts[i], responses[i])``. A reward is any
finite real number (ints are accepted and returned as floats; ``true``/``false``, strings,
``NaN`` and ``Infinity`` are not). Extra keys in the answer are ignored. An empty batch is
answered locally with ``[]`` and sends nothing.

Failures and retries. An attempt fails on a connection error, a timeout (``timeout_s`` per
socket operation), an HTTP status >= 500, or a malformed answer (not JSON, no ``rewards``
list, wrong length, a value that is not a finite number). Such an attempt is retried up to
``max_retries`` times, sleeping ``backoff_s * 2**k`` after the ``k``-th failed attempt
(``k = 0, 1, ...``). Any other non-2xx status (4xx: a bad request, i.e. a client or
deployment bug) is not retried. When no attempt succeeds :class:`RemoteRewardError` is
raised, naming the url, the number of attempts and the last error - a made-up score is
never returned. :func:`nobubble.rl.system.rewards.server.serve_rewards` is a reference server
that speaks this format.
"""

from __future__ import annotations

import http.client
import json
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from nobubble.rl.system.tasks.spec import as_reward
from nobubble.validation import check_value

__all__ = ["RemoteReward", "RemoteRewardError", "check_pairs"]

_EXAMPLE_URL = "http://127.0.0.1:8000/score"
_EXCERPT_CHARS = 200  # how much of a bad answer an error message quotes


class RemoteRewardError(RuntimeError):
    """The reward service gave no valid answer: every attempt failed, or it refused (4xx)."""


class _Retryable(Exception):
    """One attempt failed in a way that another attempt may fix; the message says how."""


class _Refused(Exception):
    """The server refused the request (a status < 500 other than 2xx); retrying won't help."""


@dataclass(frozen=True)
class RemoteReward:
    """Score ``(prompt, response)`` pairs with a remote service (see the module docstring).

    Attributes:
        url: the scoring endpoint, ``http://`` or ``https://`` with a host, e.g.
            ``http://127.0.0.1:8000/score``.
        timeout_s: seconds each socket operation of one attempt may take, > 0.
        max_retries: further attempts after a failed one, >= 0 (``max_retries + 1`` in all).
        backoff_s: base of the exponential sleep between attempts, >= 0: ``backoff_s *
            2**(a - 1)`` before attempt ``a`` (a = 1, 2, ...).
        sleep: how to wait between attempts (``time.sleep``; a test passes its own).
    """

    url: str
    timeout_s: float = 10.0
    max_retries: int = 2
    backoff_s: float = 0.05
    sleep: Callable[[float], None] = field(default=time.sleep, repr=False, compare=False)

    def __post_init__(self) -> None:
        _check_url(self.url)
        check_value("RemoteReward.timeout_s", self.timeout_s, "> 0")
        check_value("RemoteReward.max_retries", self.max_retries, ">= 0", integer=True)
        check_value("RemoteReward.backoff_s", self.backoff_s, ">= 0")

    def __call__(self, prompts: list[str], responses: list[str]) -> list[float]:
        """Rewards of the pairs, ``len(prompts)`` floats; see :meth:`score`."""
        rewards, _ = self.score(prompts, responses)
        return rewards

    def score(self, prompts: list[str], responses: list[str]) -> tuple[list[float], int]:
        """``(rewards, num_retries)``: the ``B`` rewards and how many retries they took.

        Args:
            prompts: ``B`` prompt strings.
            responses: ``B`` response strings; ``responses[i]`` answers ``prompts[i]``.

        Raises:
            ValueError: the batch is malformed (lengths differ, a non-string item).
            RemoteRewardError: no attempt got a valid answer, or the server answered 4xx.
        """
        check_pairs(prompts, responses)
        if not prompts:
            return [], 0
        body = json.dumps({"prompts": list(prompts), "responses": list(responses)}).encode()
        num_attempts = self.max_retries + 1
        last_error = ""
        for attempt in range(num_attempts):
            if attempt:
                self.sleep(self.backoff_s * 2 ** (attempt - 1))
            try:
                raw = _post(self.url, body, self.timeout_s)
                return _parse_rewards(raw, len(prompts)), attempt
            except _Refused as err:
                raise RemoteRewardError(
                    f"reward service {self.url} refused the request after "
                    f"{_plural(attempt + 1, 'attempt')} ({err}); a status < 500 is not retried: "
                    "check the url's path and what the server expects"
                ) from None
            except _Retryable as err:
                last_error = str(err)
        raise RemoteRewardError(
            f"reward service {self.url} gave no valid answer in "
            f"{_plural(num_attempts, 'attempt')}; last error: {last_error}"
        )


def _check_url(url: object) -> None:
    problem = (
        f"RemoteReward.url={url!r} must be an http:// or https:// URL with a host, "
        f"e.g. {_EXAMPLE_URL!r}"
    )
    if not isinstance(url, str):
        raise ValueError(problem)
    parts = urlsplit(url)
    try:
        parts.port  # noqa: B018 - raises ValueError on a port that is not a number
    except ValueError:
        raise ValueError(problem) from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(problem)


def check_pairs(prompts: Any, responses: Any) -> None:
    """Raise ValueError unless ``prompts`` and ``responses`` are lists of strings of one
    length: the batch of the wire format, checked alike by the client before it sends and
    by :mod:`~nobubble.rl.system.rewards.server` when it receives."""
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
    """The body of a 2xx answer to ``POST url``; raises _Retryable or _Refused otherwise."""
    request = urllib.request.Request(
        url,
        data=body,
        method="POST",
        headers={"Content-Type": "application/json", "Accept": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            return response.read()
    except urllib.error.HTTPError as err:  # before URLError and OSError: it subclasses both
        detail = _excerpt(_read_quietly(err))
        message = f"HTTP {err.code}" + (f": {detail}" if detail else "")
        if err.code >= 500:
            raise _Retryable(message) from None
        raise _Refused(message) from None
    except TimeoutError:
        raise _Retryable(f"timed out after {timeout_s}s") from None
    except urllib.error.URLError as err:
        if isinstance(err.reason, TimeoutError):
            raise _Retryable(f"timed out after {timeout_s}s") from None
        raise _Retryable(f"connection failed: {err.reason}") from None
    except (http.client.HTTPException, OSError) as err:
        raise _Retryable(f"connection failed: {type(err).__name__}: {err}") from None


def _read_quietly(err: urllib.error.HTTPError) -> bytes:
    try:
        return err.read()
    except (http.client.HTTPException, OSError):
        return b""


def _parse_rewards(raw: bytes, num_pairs: int) -> list[float]:
    """The ``num_pairs`` finite rewards in a ``{"rewards": [...]}`` body, else _Retryable."""
    try:
        payload = json.loads(raw)
    except ValueError:  # JSONDecodeError and UnicodeDecodeError
        raise _Retryable(f"malformed answer (not JSON): {_excerpt(raw)!r}") from None
    if not isinstance(payload, dict) or not isinstance(payload.get("rewards"), list):
        raise _Retryable(f"malformed answer (no 'rewards' list): {_excerpt(raw)!r}")
    values = payload["rewards"]
    if len(values) != num_pairs:
        raise _Retryable(
            f"malformed answer: {len(values)} rewards for {num_pairs} prompt/response pairs"
        )
    try:
        return [as_reward(value, f"the service for pair {i}") for i, value in enumerate(values)]
    except ValueError as err:
        raise _Retryable(f"malformed answer: {err}") from None


def _excerpt(raw: bytes) -> str:
    text = raw.decode("utf-8", errors="replace").strip()
    return text if len(text) <= _EXCERPT_CHARS else text[:_EXCERPT_CHARS] + "..."


def _plural(count: int, noun: str) -> str:
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"
