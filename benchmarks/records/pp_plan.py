"""``benchmarks/pp_plan.py``: the planner's plan against the exhaustive best, the naive
default, ``balance="params"`` and torch's runtime, measured (docs/pipeline/plan.md)."""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from benchmarks._common import Record, Result, json_key, load_result, optional
from benchmarks.records import Renderer, f, md_table, times


@dataclass(frozen=True, kw_only=True)
class PlanChoice(Record):
    sizes: list[int]
    schedule: str


@dataclass(frozen=True, kw_only=True)
class PlanRun(Record):
    """One configuration run (a cut, schedule, recompute); ``labels`` name what chose it
    (``plan``, ``naive (split_model) 1f1b``, ...); times in ms, memory in bytes."""

    labels: list[str]
    cuts: list[int]
    sizes: list[int]
    schedule: str
    recompute: bool
    num_microbatches: int
    predicted_step_ms: float
    predicted_peak_bytes: list[float]
    measured_step_ms: float
    rounds_ms: list[float]
    measured_over_predicted: float
    measured_peak_bytes: list[int]
    torch_step_ms: float | None = optional()


@dataclass(frozen=True, kw_only=True)
class ModelPlans(Record):
    blocks: int
    block_total_ms: list[float]
    plan_seconds: float
    op_overhead_ms: float
    comm_ms_per_byte: float
    plan: PlanChoice
    rows: list[PlanRun]
    exhaustive_best: str
    plan_over_best: float
    naive_over_plan: float
    memory_limit_bytes: float
    memory_limited_fits: bool


@dataclass(frozen=True, kw_only=True)
class WiderLayer(Record):
    """The transformer's plan as is and with its last layer's feed-forward 3x wider."""

    as_is: PlanChoice = json_key("as is")
    wider: PlanChoice = json_key("last layer 3x wider")
    cut_moved: bool


@dataclass(frozen=True, kw_only=True)
class PpPlan(Result):
    ranks: int
    microbatches: int
    rounds: int
    steps: int
    quick: bool
    torch: str
    models: dict[str, ModelPlans]
    wider: WiderLayer


FILES = {"pp_plan": PpPlan}


def _config(row: PlanRun) -> str:
    """Blocks per stage and schedule (and recompute, when on) of a run."""
    return f"{row.sizes} {row.schedule}" + (" + recompute" if row.recompute else "")


def _row(rows: list[PlanRun], label: str) -> PlanRun:
    return next(r for r in rows if label in r.labels)


def plan_table() -> str:
    """Per model, the plan's measured step against the exhaustive best, the naive default,
    ``balance="params"`` and torch's runtime running the plan, with the plan's predicted step
    (medians over the rounds, ms)."""
    rows = []
    for model, res in load_result(PpPlan, "pp_plan").models.items():
        runs = res.rows
        plan, naive = _row(runs, "plan"), _row(runs, "naive (split_model) 1f1b")
        params, best = _row(runs, "params 1f1b"), _row(runs, res.exhaustive_best)
        ms = plan.measured_step_ms
        rows.append([
            model, res.blocks, _config(plan), f(ms, 0), f(plan.predicted_step_ms, 0),
            f"{best.sizes} {best.schedule}: {f(best.measured_step_ms, 0)}",
            times(ms / best.measured_step_ms),
            f"{naive.sizes}: {f(naive.measured_step_ms, 0)}", times(res.naive_over_plan),
            f"{params.sizes}: {f(params.measured_step_ms, 0)}",
            "-" if plan.torch_step_ms is None else f(plan.torch_step_ms, 0),
        ])  # fmt: skip
    headers = ["model", "blocks", "plan (blocks per stage, schedule)", "plan ms", "predicted",
               "exhaustive best, ms", "plan / best", "naive 1F1B, ms", "naive / plan",
               "params 1F1B, ms", "torch runs the plan, ms"]  # fmt: skip
    return md_table(headers, rows, "l" + "r" * (len(headers) - 1))


def plan_prediction_table() -> str:
    """Measured over predicted step time, the plan's rows and the median over every
    configuration run; the memory-limited plan's peak against its limit."""
    rows = []
    for model, res in load_result(PpPlan, "pp_plan").models.items():
        runs = res.rows
        plan, limited = _row(runs, "plan"), _row(runs, "memory-limited plan")
        ratios = sorted(r.measured_over_predicted for r in runs)
        rows.append([
            model, f(plan.measured_over_predicted, 2), f(limited.measured_over_predicted, 2),
            f(statistics.median(ratios), 2), f"{f(ratios[0], 2)} to {f(ratios[-1], 2)}",
            _config(limited),
            f"{max(limited.measured_peak_bytes) / 2**20:.1f} / "
            f"{res.memory_limit_bytes / 2**20:.1f}",
        ])  # fmt: skip
    headers = ["model", "plan: measured / predicted", "memory-limited plan: measured / predicted",
               "median, all rows", "range, all rows", "memory-limited plan",
               "its peak / limit, MiB"]  # fmt: skip
    return md_table(headers, rows)


def plan_wider_table() -> str:
    """The transformer's plan as is and with its last layer's feed-forward 3x wider
    (re-profiled, re-planned)."""
    w = load_result(PpPlan, "pp_plan").wider
    rows = [[label, f"{c.sizes} {c.schedule}"]
            for label, c in (("as is", w.as_is), ("last layer 3x wider", w.wider))]  # fmt: skip
    rows.append(["the cut moved", "yes" if w.cut_moved else "no"])
    return md_table(["transformer (1F1B, ZB-H1, ZB-2p weighed)", "plan"], rows, "ll")


TABLES: dict[str, Renderer] = {
    "pipeline.plan": plan_table,
    "pipeline.plan_prediction": plan_prediction_table,
    "pipeline.plan_wider": plan_wider_table,
}
