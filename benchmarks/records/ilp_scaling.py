"""``benchmarks/ilp_scaling.py``: the exact solver against the best heuristic, its scaling,
a memory sweep, three solvers on one model and two chunks per rank (docs/pipeline/ilp.md, and
the README's headline)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from benchmarks._common import Record, Result, load_result, optional
from benchmarks.records import Renderer, f, md_table, pct


@dataclass(frozen=True, kw_only=True)
class IlpRow(Record):
    """One case: the best heuristic's span (ms) and bubble beside the solver's; solver
    figures are ``None`` where it found no schedule."""

    case: str
    p: int
    m: int
    mem_limit: float | None
    heuristic: str
    heuristic_span: float
    heuristic_bubble: float
    status: str
    ilp_span: float | None
    ilp_bubble: float | None
    lower_bound: float | None
    gap: float | None
    solve_seconds: float
    span_reduction: float | None


@dataclass(frozen=True, kw_only=True)
class IlpSweepRow(IlpRow):
    """A memory-sweep case: its limit in units of one microbatch's activations (M_F)."""

    mem_limit_MF: float


@dataclass(frozen=True, kw_only=True)
class SolverRow(Record):
    """The same model in CP-SAT and as the big-M MILP in HiGHS and SCIP."""

    case: str
    p: int
    m: int
    cpsat_seconds: float
    cpsat_status: str
    cpsat_span: float
    highs_seconds: float
    highs_status: str
    highs_span: float | None
    binaries: int
    scip_seconds: float
    scip_status: str
    scip_span: float | None


@dataclass(frozen=True, kw_only=True)
class ChunkRow(Record):
    """Two chunks per rank: the baseline (or the best warm start), the solver's schedule,
    its proven bound; memory in M_F."""

    case: str
    p: int
    m: int
    placement: str
    mem_limit_MF: float | None
    baseline: str | None
    baseline_span: float | None
    baseline_bubble: float | None
    baseline_peak_MF: float | None
    heuristic: str | None
    heuristic_span: float | None
    heuristic_bubble: float | None
    status: str
    ilp_span: float | None
    ilp_bubble: float | None
    ilp_peak_MF: float | None
    lower_bound: float | None
    gap: float | None
    solve_seconds: float
    time_limit_s: float
    workers: int
    bubble_lower_bound: float | None


@dataclass(frozen=True, kw_only=True)
class ChunkModelRow(ChunkRow):
    """A P=8 two-chunk case on a model's costs at a memory ``level``."""

    model: str
    level: str


@dataclass(frozen=True, kw_only=True)
class IlpScaling(Result):
    quick: bool
    workers: int
    time_limit_s: float
    big_time_limit_s: float
    load_average: list[float]
    grid: list[IlpRow]
    scaling: list[IlpRow]
    memory_sweep: list[IlpSweepRow]
    solvers: list[SolverRow]
    chunks_grid: list[ChunkRow] | None = optional()  # sections 5 and 6: ``--chunks-only`` adds them
    chunks_p8: list[ChunkModelRow] | None = optional()
    chunks_load_average: list[float] | None = optional()


FILES = {"ilp_scaling": IlpScaling}

_HEADERS = ["case", "best heuristic: span ms (bubble)", "ILP status",
            "ILP span ms (bubble)", "gap", "seconds", "span cut"]  # fmt: skip


def _maybe_pct(value: float | None) -> str:
    return "-" if value is None else pct(value, 2)


def _span(span: float | None, bubble: float | None) -> str:
    return "-" if span is None or bubble is None else f"{span:.3f} ({pct(bubble, 2)})"


def _ilp_rows(rows: Sequence[IlpRow]) -> str:
    out = [
        [r.case, f"{r.heuristic} {_span(r.heuristic_span, r.heuristic_bubble)}", r.status,
         _span(r.ilp_span, r.ilp_bubble), _maybe_pct(r.gap), f(r.solve_seconds),
         _maybe_pct(r.span_reduction)]
        for r in rows
    ]  # fmt: skip
    return md_table(_HEADERS, out, align="lrlrrrr")


def _data() -> IlpScaling:
    return load_result(IlpScaling, "ilp_scaling")


def ilp_grid() -> str:
    return _ilp_rows(_data().grid)


def ilp_p8() -> str:
    return _ilp_rows(_data().scaling)


def ilp_memory_sweep() -> str:
    return _ilp_rows(_data().memory_sweep)


def ilp_solvers() -> str:
    """The same model in CP-SAT and as the big-M MILP in HiGHS and SCIP."""
    rows = [
        [r.case, r.binaries, f"{f(r.cpsat_seconds)} s {r.cpsat_status}",
         f"{f(r.highs_seconds)} s {r.highs_status}", f"{f(r.scip_seconds)} s {r.scip_status}",
         f"{r.cpsat_span:.3f}"]
        for r in _data().solvers
    ]  # fmt: skip
    headers = ["case", "binaries", "CP-SAT", "HiGHS", "SCIP", "optimum span ms"]
    return md_table(headers, rows)


def _ilp_chunk_rows(rows: Sequence[ChunkRow]) -> str:
    """Two chunks per rank: the baseline (or the best warm start), the solver's schedule,
    its proven bound as a bubble floor, gap and time."""
    out = []
    for r in rows:
        name = r.baseline or r.heuristic or "-"
        base = (r.baseline_span, r.baseline_bubble) if r.baseline else (
            r.heuristic_span, r.heuristic_bubble)  # fmt: skip
        limit = "none" if r.mem_limit_MF is None else f"{r.mem_limit_MF:.3g}"
        out.append([
            r.case, limit, f"{name} {_span(*base)}", r.status, _span(r.ilp_span, r.ilp_bubble),
            "-" if r.lower_bound is None else f"{r.lower_bound:.3f}",
            _maybe_pct(r.bubble_lower_bound), _maybe_pct(r.gap), f(r.solve_seconds),
        ])  # fmt: skip
    headers = ["case", "limit M_F", "baseline: span ms (bubble)", "ILP status",
               "ILP span ms (bubble)", "bound ms", "bubble >=", "gap", "seconds"]  # fmt: skip
    return md_table(headers, out, align="lrrlrrrrr")


def _chunks(rows: Sequence[ChunkRow] | None) -> str:
    if rows is None:
        raise ValueError("ilp_scaling.json lacks the two-chunk sections: run it with --chunks-only")
    return _ilp_chunk_rows(rows)


def ilp_chunks_grid() -> str:
    return _chunks(_data().chunks_grid)


def ilp_chunks_p8() -> str:
    return _chunks(_data().chunks_p8)


TABLES: dict[str, Renderer] = {
    "pipeline.ilp_grid": ilp_grid,
    "pipeline.ilp_p8": ilp_p8,
    "pipeline.ilp_memory_sweep": ilp_memory_sweep,
    "pipeline.ilp_solvers": ilp_solvers,
    "pipeline.ilp_chunks_grid": ilp_chunks_grid,
    "pipeline.ilp_chunks_p8": ilp_chunks_p8,
}
