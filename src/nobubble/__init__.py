"""nobubble: remove idle time from large-model training.

Parts: ``nobubble.pipeline`` (zero-bubble pipeline schedules, simulator,
runtime), ``nobubble.moe`` (DeepEP-style expert-parallel dispatch/combine), ``nobubble.rl``
(synchronous and asynchronous RL with off-policy corrections), ``nobubble.algorithms`` (k-way
merge) and ``nobubble.trace`` (merged per-rank execution traces).
"""

__version__ = "0.1.0"
