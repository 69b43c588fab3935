"""``benchmarks/pp_runner_vs_torch.py``: PipelineRunner against torch's pipelining runtime
on the same schedules (docs/pipeline/runtime.md)."""

from __future__ import annotations

from dataclasses import dataclass

from benchmarks._common import Record, Result, load_result
from benchmarks.records import Renderer, f, md_table, times


@dataclass(frozen=True, kw_only=True)
class RunnerVsTorchRow(Record):
    """One schedule, step times in seconds; ``in_run_*``: the simulator fed with costs
    measured in the same run."""

    schedule: str
    torch_step_s: float
    nobubble_step_s: float
    nobubble_over_torch: float
    torch_speedup_vs_1f1b: float
    nobubble_speedup_vs_1f1b: float
    predicted_makespan_ms: float
    predicted_speedup_vs_1f1b: float
    speedup_error: float
    in_run_makespan_ms: float
    in_run_speedup_vs_1f1b: float
    in_run_speedup_error: float
    in_run_step_error: float
    nobubble_over_torch_per_round: list[float]


@dataclass(frozen=True, kw_only=True)
class PpRunnerVsTorch(Result):
    ranks: int
    batch: int
    microbatches: int
    seq_len: int
    steps: int
    rounds: int
    quick: bool
    torch: str
    rows: list[RunnerVsTorchRow]


FILES = {"pp_runner_vs_torch": PpRunnerVsTorch}


def runner_vs_torch() -> str:
    """PipelineRunner against torch's runtime: step times, speed-ups over 1F1B beside the
    simulator's, and the ratio per round."""
    data = load_result(PpRunnerVsTorch, "pp_runner_vs_torch")
    rows = [
        [r.schedule, f(1e3 * r.torch_step_s), f(1e3 * r.nobubble_step_s),
         f(r.nobubble_over_torch, 3), times(r.torch_speedup_vs_1f1b, 3),
         times(r.nobubble_speedup_vs_1f1b, 3), times(r.predicted_speedup_vs_1f1b, 3),
         f"{100 * r.speedup_error:+.1f}%", times(r.in_run_speedup_vs_1f1b, 3),
         f"{100 * r.in_run_speedup_error:+.1f}%", f"{100 * r.in_run_step_error:+.1f}%"]
        for r in data.rows
    ]  # fmt: skip
    headers = ["schedule", "torch ms", "nobubble ms", "nobubble / torch", "torch vs 1f1b",
               "nobubble vs 1f1b", "simulated vs 1f1b", "error", "in-run sim vs 1f1b", "error",
               "step vs in-run sim"]  # fmt: skip
    ratios = "; ".join(f"{r.schedule} " + ", ".join(f(x, 3) for x in
                       r.nobubble_over_torch_per_round) for r in data.rows)  # fmt: skip
    return (
        f"{md_table(headers, rows)}\n\nMedians of {data.steps} steps per path, the paths "
        f"alternating, then the median of {data.rounds} runs (nobubble / torch per run: "
        f"{ratios}); batch {data.batch} x {data.seq_len} tokens in {data.microbatches} "
        f"microbatches on {data.ranks} gloo ranks; torch {data.torch}."
    )


TABLES: dict[str, Renderer] = {"pipeline.runner_vs_torch": runner_vs_torch}
