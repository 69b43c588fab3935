"""Dispatch policies: how each rank picks its next op, simulated under perturbations.

- :mod:`~nobubble.pipeline.dispatch.policy`: :func:`simulate_dispatch` ->
  :class:`DispatchResult`, for ``static`` (walk the order) and ``handshake`` (pick at run
  time from what has arrived); :data:`DISPATCH_POLICIES`
- :mod:`~nobubble.pipeline.dispatch.handshake`: the rule, its deadlock-freedom argument,
  :func:`choose_op` (the rule itself, which the runtime calls too), :class:`HandshakeRule`,
  :func:`run_handshake` -> :class:`HandshakeRun`, :func:`plan_peaks`
- :mod:`~nobubble.pipeline.dispatch.perturb`: :class:`Perturbation` (per-op jitter,
  stragglers, seed), :class:`Straggler`, :func:`parse_straggler`

The static walk is the simulator's own (:func:`~nobubble.pipeline.simulate.run_timeline`
with a duration per op, summarised by :func:`~nobubble.pipeline.simulate.summarize`).
"""

from __future__ import annotations

from nobubble.pipeline.dispatch.handshake import (
    HandshakeRule,
    HandshakeRun,
    choose_op,
    plan_peaks,
    run_handshake,
)
from nobubble.pipeline.dispatch.perturb import (
    OpDurations,
    Perturbation,
    Straggler,
    parse_straggler,
)
from nobubble.pipeline.dispatch.policy import DISPATCH_POLICIES, DispatchResult, simulate_dispatch

__all__ = [
    "DISPATCH_POLICIES",
    "DispatchResult",
    "simulate_dispatch",
    "HandshakeRule",
    "HandshakeRun",
    "choose_op",
    "run_handshake",
    "plan_peaks",
    "Perturbation",
    "Straggler",
    "OpDurations",
    "parse_straggler",
]
