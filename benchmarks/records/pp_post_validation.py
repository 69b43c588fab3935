"""``benchmarks/pp_post_validation.py``: the optimizer step after ``runner.step``,
synchronous against post-validated (docs/pipeline/runtime.md)."""

from __future__ import annotations

from dataclasses import dataclass

from benchmarks._common import Record, Result, load_result
from benchmarks.records import Renderer, f, md_table


@dataclass(frozen=True, kw_only=True)
class PostValidationRow(Record):
    """One clipping threshold on one rank; medians in seconds."""

    max_norm: float
    rank: int
    sync_optimizer_s: float
    post_optimizer_s: float
    sync_step_s: float
    post_step_s: float
    clipped_steps: int
    steps: int


@dataclass(frozen=True, kw_only=True)
class PpPostValidation(Result):
    ranks: int
    schedule: str
    batch: int
    steps: int
    rows: list[PostValidationRow]


FILES = {"pp_post_validation": PpPostValidation}


def post_validation_table() -> str:
    """The optimizer phase after ``runner.step``, synchronous against post-validated."""
    data = load_result(PpPostValidation, "pp_post_validation")
    rows = [
        [f(r.max_norm, 1), r.rank, f"{r.clipped_steps}/{r.steps}", f(1e3 * r.sync_optimizer_s),
         f(1e3 * r.post_optimizer_s), f(1e3 * r.sync_step_s), f(1e3 * r.post_step_s)]
        for r in data.rows
    ]  # fmt: skip
    headers = ["max_norm", "rank", "steps clipped", "sync optimizer ms",
               "post-validated optimizer ms", "sync step ms", "post-validated step ms"]  # fmt: skip
    return (
        f"{md_table(headers, rows)}\n\nMedians of {data.steps} steps per path, the paths "
        f"alternating; {data.schedule} on {data.ranks} gloo ranks, batch {data.batch}; the "
        "optimizer phase runs from the end of `runner.step` to a confirmed step."
    )


TABLES: dict[str, Renderer] = {"pipeline.post_validation": post_validation_table}
