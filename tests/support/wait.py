"""Waiting for an event: a hang guard in ``make test``, a timed bound in the long tier.

In ``make test`` a ``timeout_s`` is not a claim about speed; it only turns a hang into a
failure: pick it at least 5x the slowest run seen, so that a busy machine never trips it
(:func:`tier_bound` chooses between the two for tests that run in both tiers).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")

__all__ = ["tier_bound", "wait_for"]

HANG_GUARD_S = 60.0
"""The fast tier's wait for what the long tier bounds (at least 5x any bound it checks)."""


def wait_for(condition: Callable[[], T], *, timeout_s: float, what: str,
             poll_s: float = 0.05) -> T:  # fmt: skip
    """Poll ``condition`` until it returns something truthy and return that; raise
    ``TimeoutError`` naming ``what`` after ``timeout_s`` (a hang guard)."""
    deadline = time.monotonic() + timeout_s
    while not (value := condition()):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: still not true after {timeout_s:.0f}s")
        time.sleep(poll_s)
    return value


def tier_bound(request: Any, bound_s: float, guard_s: float = HANG_GUARD_S) -> float:
    """``bound_s`` in a test marked ``long`` (the documented bound, checked there), else the
    hang guard ``guard_s`` (``request``: pytest's fixture of the running test)."""
    return bound_s if request.node.get_closest_marker("long") else max(guard_s, 5 * bound_s)
