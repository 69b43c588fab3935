"""Work budgets of a pipeline shape, in ops (one F, B or W of one stage on one microbatch),
measured so that the largest shape each kind of work takes finishes within 30 s and 2 GB
(``tests/cli/test_budgets.py``); the V generators' search also grows with ranks x ops.
"""

from __future__ import annotations

from nobubble.pipeline.schedules.v_memory import V_MEMORY_NAMES

__all__ = ["OPS_BUDGET", "V_MEMORY_BUDGET", "V_MEMORY_OPS", "num_ops", "check_ops"]

OPS_BUDGET = {"default": 1_000_000, "compare": 10_000, "solve": 50_000}
V_MEMORY_BUDGET, V_MEMORY_OPS = 1_600_000, 200_000
"""The V generators' bounds: ranks x ops, and ops."""


def num_ops(num_ranks: int, num_microbatches: int, num_chunks: int | None = None) -> int:
    """The ops of a schedule with F, B and W of ``num_chunks`` stages per rank (at most 2
    unless given) on every microbatch."""
    return 3 * num_ranks * (num_chunks or 2) * num_microbatches


def check_ops(
    num_ranks: int,
    num_microbatches: int,
    *,
    num_chunks: int | None = None,
    budget: str = "default",
    schedule: str | None = None,
    v_memory: bool = False,
) -> None:
    """Refuse, before any work, a pipeline whose :func:`num_ops` passes ``budget`` (a key of
    :data:`OPS_BUDGET`), and the V generators' bounds when ``schedule`` names one of them or
    ``v_memory`` (the caller builds them all).

    Raises:
        ValueError: the shape is past a budget; the error names the sizes, the count and the
            budget.
    """
    ops, limit = num_ops(num_ranks, num_microbatches, num_chunks), OPS_BUDGET[budget]
    shape = f"{num_ranks} ranks x {num_microbatches} microbatches"
    if ops > limit:
        raise ValueError(f"{shape} means about {ops:,} ops, past the {budget!r} budget of "
                         f"{limit:,} (seconds of work here); use smaller sizes")  # fmt: skip
    if v_memory or schedule in V_MEMORY_NAMES:
        what = "the V schedules" if v_memory else schedule
        v_ops = num_ops(num_ranks, num_microbatches, 2)
        for amount, bound, unit in ((v_ops, V_MEMORY_OPS, "ops"),
                                    (num_ranks * v_ops, V_MEMORY_BUDGET, "ranks x ops")):  # fmt: skip
            if amount > bound:
                raise ValueError(f"{what}: {shape} means about {amount:,} {unit} for the V "
                                 f"generators, past their budget of {bound:,}; use smaller "
                                 "sizes or another schedule")  # fmt: skip
