"""Exact optimal zero-bubble schedules (CP-SAT, cross-checked by the paper's big-M MILP).

- :mod:`.solve`: :func:`solve_optimal` -> :class:`SolveResult`, warm-started by the heuristics.
- :mod:`.model`: the integer problem, its CP-SAT model, ASAP times and peak memory.
- :mod:`.milp`: the same problem as the paper's big-M MILP (HiGHS, SCIP or CBC), an
  independent formulation that must reach the same optimum.
"""

from __future__ import annotations

from nobubble.pipeline.ilp.solve import DEFAULT_WORKERS, HEURISTIC_NAMES, SolveResult, solve_optimal

__all__ = ["SolveResult", "solve_optimal", "HEURISTIC_NAMES", "DEFAULT_WORKERS"]
