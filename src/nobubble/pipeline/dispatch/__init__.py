"""Dispatch policies, simulated under perturbations: :mod:`.policy` (:func:`simulate_dispatch`,
``static`` or ``handshake``), :mod:`.handshake` (the rule, :func:`choose_op`, which the
runtime calls too) and :mod:`.perturb` (per-op jitter, stragglers, a seed).
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
