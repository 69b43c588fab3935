"""The client of a reward service over HTTP: :class:`RemoteReward`, one batched POST a call.

The wire format (JSON, UTF-8; the shape of OpenRLHF's ``--remote_rm_url``)::

    POST <url>   {"prompts": ["p0", "p1", ...], "responses": ["r0", "r1", ...]}
    200          {"rewards": [0.75, -2.0, ...]}

``rewards[i]`` scores ``(prompts[i], responses[i])``: ``B`` of each, a reward any finite real
(ints become floats; booleans, strings, NaN and infinities are malformed). Extra keys are
ignored; an empty batch is answered locally with ``[]``. An attempt fails on a connection
error, a timeout (``timeout_s`` per socket operation), a status >= 500 or a malformed answer,
and is retried up to ``max_retries`` times; any other non-2xx status (a 4xx: a client or
deployment bug) is not. :class:`RemoteRewardError` then names the url, the attempts and the
last error: a made-up score is never returned. :mod:`.server` is a reference server.
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

from nobubble.rl.system.tasks import as_reward
from nobubble.validation import check_value

__all__ = ["RemoteReward", "RemoteRewardError", "check_pairs"]

_EXCERPT_CHARS = 200  # how much of a bad answer an error message quotes


class RemoteRewardError(RuntimeError):
    """The reward service gave no valid answer: every attempt failed, or it refused (4xx)."""


class _AttemptFailed(Exception):
    """One attempt failed; ``retry``: whether another attempt may fix it (not after a 4xx)."""

    def __init__(self, message: str, retry: bool = True) -> None:
        super().__init__(message)
        self.retry = retry


@dataclass(frozen=True)
class RemoteReward:
    """Score ``(prompt, response)`` pairs with a remote service (see the module docstring).

    Attributes:
        url: the scoring endpoint, ``http://`` or ``https://`` with a host.
        timeout_s: seconds each socket operation of one attempt may take, > 0.
        max_retries: further attempts after a failed one, >= 0.
        backoff_s: base of the exponential sleep, >= 0: ``backoff_s * 2**(a - 1)`` before
            attempt ``a`` (a = 1, 2, ...).
        sleep: how to wait between attempts (``time.sleep``; a test passes its own).
    """

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

    def __call__(self, prompts: list[str], responses: list[str]) -> list[float]:
        """Rewards of the pairs, ``len(prompts)`` floats; see :meth:`score`."""
        return self.score(prompts, responses)[0]

    def score(self, prompts: list[str], responses: list[str]) -> tuple[list[float], int]:
        """``(rewards, num_retries)``: the ``B`` rewards of ``B`` prompts and their responses,
        and how many retries they took.

        Raises:
            ValueError: the batch is malformed (lengths differ, a non-string item).
            RemoteRewardError: no attempt got a valid answer, or the server answered 4xx.
        """
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
            except _AttemptFailed as err:
                if not err.retry:
                    raise RemoteRewardError(
                        f"reward service {self.url} refused the request after "
                        f"{_attempts(attempt + 1)} ({err}); a status < 500 is not retried: "
                        "check the url's path and what the server expects"
                    ) from None
                last_error = str(err)
        raise RemoteRewardError(
            f"reward service {self.url} gave no valid answer in "
            f"{_attempts(self.max_retries + 1)}; last error: {last_error}"
        )


def check_pairs(prompts: Any, responses: Any) -> None:
    """Raise ValueError unless ``prompts`` and ``responses`` are lists of strings of one
    length: the batch of the wire format, checked by the client and by the server."""
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
    """The body of a 2xx answer to ``POST url``, else :class:`_AttemptFailed`."""
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
        raise _AttemptFailed(message, retry=err.code >= 500) from None
    except (http.client.HTTPException, OSError) as err:  # URLError and TimeoutError too
        reason = err.reason if isinstance(err, urllib.error.URLError) else err
        if isinstance(reason, TimeoutError):
            raise _AttemptFailed(f"timed out after {timeout_s}s") from None
        raise _AttemptFailed(f"connection failed: {reason!r}") from None


def _parse_rewards(raw: bytes, num_pairs: int) -> list[float]:
    """The ``num_pairs`` finite rewards in a ``{"rewards": [...]}`` body."""
    try:
        values = json.loads(raw)["rewards"]
    except (ValueError, TypeError, KeyError, IndexError):  # JSONDecodeError, UnicodeDecodeError
        values = None
    if not isinstance(values, list):
        raise _AttemptFailed(f"malformed answer (no JSON 'rewards' list): {_excerpt(raw)!r}")
    if len(values) != num_pairs:
        raise _AttemptFailed(
            f"malformed answer: {len(values)} rewards for {num_pairs} prompt/response pairs"
        )
    try:
        return [as_reward(value, f"the service for pair {i}") for i, value in enumerate(values)]
    except ValueError as err:
        raise _AttemptFailed(f"malformed answer: {err}") from None


def _excerpt(raw: bytes) -> str:
    text = raw.decode("utf-8", errors="replace").strip()
    return text if len(text) <= _EXCERPT_CHARS else text[:_EXCERPT_CHARS] + "..."


def _attempts(count: int) -> str:
    return f"{count} attempt" + ("s" if count != 1 else "")
