"""Exact optimal zero-bubble schedules (CP-SAT, with a PuLP/CBC MILP cross-check).

- :mod:`.solve`: :func:`solve_optimal` -> :class:`SolveResult`, warm-started by the heuristics.
- :mod:`.model`: the integer problem, its CP-SAT model, ASAP times and peak memory.
- :mod:`.milp`: the same problem as a time-indexed MILP, an independent formulation.
"""

from __future__ import annotations

from nobubble.pipeline.ilp.solve import DEFAULT_WORKERS, HEURISTIC_NAMES, SolveResult, solve_optimal

__all__ = ["SolveResult", "solve_optimal", "HEURISTIC_NAMES", "DEFAULT_WORKERS"]
