"""The comparison table for one configuration: every schedule on the same costs.

:func:`compare_schedules` generates ours, imports torch's own when this torch has them,
optionally solves the exact ILP, and simulates all. ``throughput_vs_1f1b = max span(1F1B) /
max span(x)`` (the paper's measure: consecutive steps overlap); ``throughput_vs_1f1b_flush =
makespan(1F1B) / makespan(x)`` (a full flush between steps, the pessimistic bound). Memory is
the largest per-rank activation peak relative to 1F1B's.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from nobubble.pipeline.costs import CostModel
from nobubble.pipeline.simulate import SimResult, simulate

__all__ = ["CompareRow", "compare_schedules", "cost_summary", "OUR_SCHEDULES"]

OUR_SCHEDULES = ("gpipe", "1f1b", "interleaved-1f1b", "zb-h1", "zb-h2", "zb-1p", "zb-2p", "zb-v")
_KIND = {"zb-1p": "heuristic", "zb-2p": "heuristic"}


@dataclass(frozen=True, slots=True)
class CompareRow:
    """One schedule's figures; ``result`` is None when it could not be built (see note)."""

    name: str
    source: str  # "nobubble", "torch" or "ilp"
    kind: str  # "hand-written", "heuristic", "ILP (optimal)", ...
    result: SimResult | None
    throughput_vs_1f1b: float | None
    throughput_vs_1f1b_flush: float | None
    note: str = ""

    def as_dict(self) -> dict:
        r = self.result
        return {
            "schedule": self.name, "source": self.source, "kind": self.kind,
            "bubble_rate": r.bubble_rate if r else None,
            "makespan": r.makespan if r else None,
            "peak_memory_vs_1f1b": r.max_peak_memory_vs_1f1b if r else None,
            "throughput_vs_1f1b": self.throughput_vs_1f1b,
            "throughput_vs_1f1b_flush": self.throughput_vs_1f1b_flush, "note": self.note,
        }  # fmt: skip


def cost_summary(costs: CostModel) -> dict:
    """``costs`` per rank as a comparison reports them: ``t_f``, ``t_b``, ``t_w``, ``mem_f``
    one number when every rank has the same, else the list; ``t_comm``."""
    summary = {k: getattr(costs, k) for k in ("t_f", "t_b", "t_w", "t_comm", "mem_f")}
    return {k: v if k == "t_comm" else v[0] if len(set(v)) == 1 else list(v)
            for k, v in summary.items()}  # fmt: skip


def _ours(name, costs, p, m, mem_limit, num_chunks):
    from nobubble.pipeline.schedules import get_schedule

    limit = mem_limit if name in ("zb-1p", "zb-2p") else None
    chunks = num_chunks if name == "interleaved-1f1b" else None
    return get_schedule(name, num_ranks=p, num_microbatches=m, costs=costs, mem_limit=limit,
                        num_chunks=chunks)  # fmt: skip


def _ilp_row(costs, p, m, mem_limit, time_limit_s) -> tuple[str, str, SimResult | None, str]:
    from nobubble.pipeline.ilp.solve import solve_optimal

    limit = mem_limit if mem_limit is not None else p * costs.mem_f[0]
    res = solve_optimal(costs, num_stages=p, num_microbatches=m, mem_limit=limit,
                        time_limit_s=time_limit_s)  # fmt: skip
    if res.schedule is None:
        return "ilp", f"ILP ({res.status})", None, res.explanation
    gap = f", gap {res.gap:.1%}" if res.gap else ""
    return "ilp", f"ILP ({res.status}{gap})", simulate(res.schedule, costs), ""


def compare_schedules(
    costs: CostModel,
    *,
    num_stages: int,
    num_microbatches: int,
    names: Sequence[str] = OUR_SCHEDULES,
    include_torch: bool = True,
    ilp_time_limit_s: float | None = None,
    mem_limit: float | None = None,
    num_chunks: int = 2,
    on_step: Callable[[str], None] | None = None,
) -> list[CompareRow]:
    """Simulate every schedule on ``costs`` (per rank). ``mem_limit`` (absolute, unit of
    ``costs.mem_f``) overrides zb-1p/zb-2p's defaults; ``ilp_time_limit_s`` adds the ILP row
    (ZB-1p's memory limit unless ``mem_limit``) when :mod:`nobubble.pipeline.ilp.solve` exists."""
    p, m = num_stages, num_microbatches
    # Callable[..., ...]: each runner is a lambda that binds its name as a default argument
    entries: list[tuple[str, str, str, Callable[..., SimResult]]] = []
    for name in names:
        kind = _KIND.get(name, "hand-written")
        entries.append((name, "nobubble", kind, lambda n=name: simulate(
            _ours(n, costs, p, m, mem_limit, num_chunks), costs)))  # fmt: skip
    if include_torch:
        from nobubble.pipeline.schedules.from_torch import available_torch_schedules, torch_schedule

        for name in available_torch_schedules():
            entries.append((name, "torch", "torch", lambda n=name: simulate(
                torch_schedule(n, num_stages=p, num_microbatches=m), costs)))  # fmt: skip
    rows: list[tuple[str, str, str, SimResult | None, str]] = []
    for name, source, kind, run in entries:
        if on_step:
            on_step(name)
        try:
            rows.append((name, source, kind, run(), ""))
        except ValueError as err:  # a size this schedule refuses, or torch's invalid order
            rows.append((name, source, kind, None, str(err)))
    if ilp_time_limit_s is not None and importlib.util.find_spec("nobubble.pipeline.ilp.solve"):
        if on_step:
            on_step("ilp")
        source, kind, result, note = _ilp_row(costs, p, m, mem_limit, ilp_time_limit_s)
        rows.append(("zb-ilp", source, kind, result, note))
    base = next((r for n, _, _, r, _ in rows if n == "1f1b" and r is not None), None)
    return [
        CompareRow(name, source, kind, result,
                   base.max_span / result.max_span if base and result else None,
                   base.makespan / result.makespan if base and result else None, note)
        for name, source, kind, result, note in rows
    ]  # fmt: skip
