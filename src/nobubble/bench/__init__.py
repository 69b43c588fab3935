"""Measuring code shared by ``benchmarks/`` and ``nobubble demo`` / ``nobubble ep bench``.

Each module runs a baseline and the path it measures in the same processes and returns frozen
result objects or plain dicts ready for JSON; printing them is the command line's job.
"""
