"""The examples are scripts, run as ``python examples/NAME.py``; this file only lets the
benchmarks (``python -m benchmarks.NAME`` from the repository root) import their models as
``examples.NAME``."""
