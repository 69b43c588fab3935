"""``benchmarks/pp_runtime.py``: the B/W split's cost and the measured speed-ups of each
schedule beside the simulator's (docs/pipeline/runtime.md, and the README's headline)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from benchmarks._common import Record, Result, load_result, optional
from benchmarks.records import Renderer, f, md_table, pct
from nobubble.pipeline.runtime.models import GPTConfig


@dataclass(frozen=True, kw_only=True)
class StageProfile(Record):
    """One stage's profiled op costs (ms) and memory (bytes)."""

    stage: int
    blocks: list[int]
    t_f: float
    t_b: float
    t_w: float
    t_bw_fused: float
    mem_f: int
    mem_w: int
    bw_ratio: float
    out_bytes: int | None = optional()  # files before the field lack it
    mem_b: int
    split_overhead: float


@dataclass(frozen=True, kw_only=True)
class RuntimeProfile(Record):
    model: str
    microbatch_size: int
    stages: list[StageProfile]
    t_comm: float
    activation_bytes: int
    clock: str


@dataclass(frozen=True, kw_only=True)
class BWSplit(Record):
    """T_B, T_W and the fused backward of one stage (ms), and the bytes held from B to W."""

    stage: str
    method: str
    t_b: float
    t_w: float
    fused: float
    ratio: float
    held_mib: float
    forward_saved_mib: float


@dataclass(frozen=True, kw_only=True)
class ScheduleRun(Record):
    """One schedule's measured step beside the simulator's prediction."""

    schedule: str
    steps_measured: int
    median_step_s: float
    median_makespan_s: float
    measured_speedup_step: float
    measured_speedup_makespan: float
    predicted_makespan_s: float
    predicted_speedup: float
    speedup_error: float
    paired_speedup: float
    paired_speedup_error: float
    measured_bubble: float
    predicted_bubble: float
    peak_activation_mib: list[float]
    predicted_peak_mib: list[float]


@dataclass(frozen=True, kw_only=True)
class PpRuntime(Result):
    model: GPTConfig  # the library's own (torch-free) model config
    num_microbatches: int
    microbatch_size: int
    ranks: int
    threads_per_rank: int
    load_average: list[float]
    cpus: int
    profile: RuntimeProfile
    bw_split: list[BWSplit]
    schedules: list[ScheduleRun]


FILES = {"pp_runtime": PpRuntime, "pp_runtime_quick": PpRuntime}


def runtime_bw_split() -> str:
    """T_B, T_W and the fused backward per stage, and the bytes held between B and W."""
    rows = [
        [r.stage, r.method, f(r.t_b), f(r.t_w), f(r.t_b + r.t_w), f(r.fused), f(r.ratio, 3),
         f(r.forward_saved_mib, 2), f(r.held_mib, 2)]
        for r in load_result(PpRuntime, "pp_runtime").bw_split
    ]  # fmt: skip
    headers = ["stage", "method", "T_B ms", "T_W ms", "T_B+T_W", "fused BW", "ratio",
               "F saved MiB", "held B->W MiB"]  # fmt: skip
    return md_table(headers, rows, align="ll" + "r" * (len(headers) - 2))


def _mib_pair(values: Sequence[float]) -> str:
    return " / ".join(f(v) for v in values)


def _bubble(value: float) -> str:
    return pct(max(value, 0.0))  # the simulator's exact zero can come out as -1e-16


def runtime_schedules() -> str:
    """Measured step time, speed-up, bubble and peak memory beside the simulator's."""
    data = load_result(PpRuntime, "pp_runtime")
    rows = []
    for r in data.schedules:
        error = "-" if r.schedule == "1f1b" else f"{100 * r.speedup_error:+.1f}%"
        rows.append([
            r.schedule, f(1e3 * r.median_step_s), f(1e3 * r.predicted_makespan_s),
            f(r.measured_speedup_step, 3), f(r.paired_speedup, 3), f(r.predicted_speedup, 3),
            error, _bubble(r.measured_bubble), _bubble(r.predicted_bubble),
            _mib_pair(r.peak_activation_mib), _mib_pair(r.predicted_peak_mib),
        ])  # fmt: skip
    headers = ["schedule", "step ms", "sim ms", "speed-up", "paired", "sim speed-up", "error",
               "bubble", "sim bubble", "peak act MiB r0/r1", "simulated"]  # fmt: skip
    table = md_table(headers, rows)
    prof = data.profile
    ops = [getattr(s, k) for s in prof.stages for k in ("t_f", "t_b", "t_w")]
    load_avg = " -> ".join(f(x) for x in data.load_average)
    return (
        f"{table}\n\nProfiled op costs {f(min(ops))}-{f(max(ops))} ms of CPU time, T_comm "
        f"{prof.t_comm:.2f} ms; medians of {data.schedules[0].steps_measured} steps; "
        f"load average {load_avg} on {data.cpus} CPUs during the run."
    )


TABLES: dict[str, Renderer] = {
    "pipeline.runtime_bw_split": runtime_bw_split,
    "pipeline.runtime_schedules": runtime_schedules,
}
