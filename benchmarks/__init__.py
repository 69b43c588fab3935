"""One script per claim, each run from the repository root as ``python -m benchmarks.NAME``
(``make bench`` runs them all); results as JSON under ``benchmarks/results/``. Modules whose
name starts with ``_`` are shared helpers, not benchmarks."""
