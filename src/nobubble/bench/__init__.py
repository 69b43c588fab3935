"""Measuring code shared by ``benchmarks/`` and ``nobubble demo`` / ``nobubble ep bench``.

Each measuring module runs a baseline and the path it measures in the same processes and
returns frozen result objects or plain dicts ready for JSON. How those are shown to a person
lives here too, so that the command line and the benchmark scripts print them the same way
(one copy): :mod:`~nobubble.bench.output` (tables, progress bar) and
:mod:`~nobubble.bench.ep_tables` (the MoE measurements' tables).
"""
