"""Asynchronous RL and the algorithmic corrections it needs.

- :mod:`nobubble.rl.algo`: the algorithm toolbox (advantages, losses, V-trace, corrections,
  staleness, replay, aggregation, presets); its names are re-exported here.
- :mod:`nobubble.rl.system`: the running system (tasks, policy, rollout, reward, trainer,
  experience buffer, weight sync, orchestrator, engines) built on the toolbox.
"""

from __future__ import annotations

from nobubble.rl.algo import *  # noqa: F403  (the toolbox is this package's public API)
from nobubble.rl.algo import __all__ as __all__
