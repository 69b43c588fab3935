"""The frontier's default point sources (``pp frontier``'s, and the V-memory benchmark's)."""

from __future__ import annotations

from functools import partial

from nobubble.pipeline.costs import CostModel
from nobubble.pipeline.frontier import (
    default_mem_limits,
    default_sources,
    frontier,
    generated_points,
    torch_points,
)


def _names(result) -> list[tuple[str, str, bool]]:
    return [(q.name, q.source, q.pareto) for q in result.points]


def test_default_sources_are_the_generators_at_the_default_limits_then_torch() -> None:
    costs = CostModel.uniform(4)
    limits = default_mem_limits(4)
    explicit = [partial(generated_points, mem_limits=limits), torch_points]
    default = frontier(costs, num_ranks=4, num_microbatches=8)
    assert _names(default) == _names(frontier(costs, num_ranks=4, num_microbatches=8,
                                              sources=explicit))  # fmt: skip
    assert {f"zb-auto@{limit:g}" for limit in limits} <= {q.name for q in default.points}


def test_default_sources_take_the_limits_and_leave_torch_out() -> None:
    costs = CostModel.uniform(4)
    sources = default_sources(4, mem_limits=(4.0, 2.0, 4.0), include_torch=False)  # each once
    result = frontier(costs, num_ranks=4, num_microbatches=8, sources=sources)
    assert {q.source for q in result.points} == {"nobubble"}
    assert [q.name for q in result.points if q.name.startswith("zb-auto")] == [
        "zb-auto@2",
        "zb-auto@4",
    ]
