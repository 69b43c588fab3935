"""Partial rollouts: in-flight weight updates between tokens, and per-token versions.

- :mod:`.inflight` - :class:`InFlightWeights`, the generator's hook between decoding steps;
- :mod:`.versions` - per-token versions and staleness, and the versioning rule of each mode
  (:func:`check_token_versions`).
"""

from __future__ import annotations

from nobubble.rl.system.partial.inflight import InFlightWeights, WeightPull
from nobubble.rl.system.partial.versions import (
    check_token_versions,
    lag_histogram,
    response_versions,
    token_lag,
)

__all__ = [
    "InFlightWeights",
    "WeightPull",
    "check_token_versions",
    "lag_histogram",
    "response_versions",
    "token_lag",
]
