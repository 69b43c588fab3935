"""Hang guards: wait for an event, fail with a named reason if it never comes.

A guard's ``timeout_s`` is not a claim about speed; it only turns a hang into a failure. Pick
it at least 5x the slowest run seen, so that a busy machine never trips it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

__all__ = ["wait_for"]


def wait_for(condition: Callable[[], T], *, timeout_s: float, what: str,
             poll_s: float = 0.05) -> T:  # fmt: skip
    """Poll ``condition`` until it returns something truthy and return that; raise
    ``TimeoutError`` naming ``what`` after ``timeout_s`` (a hang guard)."""
    deadline = time.monotonic() + timeout_s
    while not (value := condition()):
        if time.monotonic() > deadline:
            raise TimeoutError(f"hang guard: {what} (still not true after {timeout_s:.0f}s)")
        time.sleep(poll_s)
    return value
