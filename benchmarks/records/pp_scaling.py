"""``benchmarks/pp_scaling.py``: simulator CPU time against the number of actions
(docs/pipeline/schedules.md)."""

from __future__ import annotations

from dataclasses import dataclass

from benchmarks._common import Record, Result, load_result
from benchmarks.records import Renderer, f, md_table


@dataclass(frozen=True, kw_only=True)
class ScalingRow(Record):
    p: int
    m: int
    actions: int
    simulate_s: float
    simulate_cpu_s: float
    cpu_us_per_action: float
    sweep_baseline_s: float
    sweep_baseline_cpu_s: float
    cpu_ratio: float


@dataclass(frozen=True, kw_only=True)
class LargeRun(Record):
    """Generating and simulating zb-2p at p=32, m=256."""

    generate_s: float
    simulate_s: float
    total_s: float
    generate_cpu_s: float
    simulate_cpu_s: float
    actions: int


@dataclass(frozen=True, kw_only=True)
class PpScaling(Result):
    rows: list[ScalingRow]
    zb2p_p32_m256: LargeRun
    cpu_us_per_action_max_over_min: float
    repeats: int
    load_average: list[float]


FILES = {"pp_scaling": PpScaling}


def _seconds(value: float) -> str:
    """Seconds as the scaling table writes them: 4 decimals below 0.05 s, else 3."""
    return f(value, 4 if value < 0.05 else 3)


def scaling() -> str:
    """Simulation CPU time against the number of actions, beside the sweep baseline."""
    data = load_result(PpScaling, "pp_scaling")
    rows = [
        [r.p, r.m, f"{r.actions:,}", _seconds(r.simulate_cpu_s), f(r.cpu_us_per_action),
         _seconds(r.sweep_baseline_cpu_s)]
        for r in data.rows
    ]  # fmt: skip
    table = md_table(
        ["p", "m", "actions", "CPU s", "CPU us / action", "sweep baseline CPU s"], rows
    )
    return (
        f"{table}\n\nMedian of {data.repeats} runs; load average "
        f"{data.load_average[0]:.1f} after the run."
    )


def scaling_zb2p() -> str:
    """Generating and simulating zb-2p at p=32, m=256."""
    z = load_result(PpScaling, "pp_scaling").zb2p_p32_m256
    row = [f"{z.actions:,}", f(z.generate_cpu_s, 2), f(z.simulate_cpu_s, 2), f(z.total_s, 1)]
    return md_table(["actions", "generate CPU s", "simulate CPU s", "wall s (both)"], [row])


TABLES: dict[str, Renderer] = {
    "pipeline.scaling": scaling,
    "pipeline.scaling_zb2p": scaling_zb2p,
}
