"""Partial rollouts: in-flight weight updates between tokens (:mod:`.inflight`), and
per-token versions and staleness with each mode's versioning rule (:mod:`.versions`)."""
