"""``benchmarks/pp_replan.py``: the static cut against the re-planned one under a straggler
that starts mid-run (docs/pipeline/replan.md)."""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from benchmarks._common import Record, Result, load_result
from benchmarks.records import Renderer, f, md_table, pct


@dataclass(frozen=True, kw_only=True)
class ReplanArm(Record):
    """One pipeline's run: step times (ms), its cut after each re-plan, when it re-planned
    (steps) and how long each switch took (ms)."""

    step_ms: list[float]
    sizes: list[list[int]]
    replanned_at: list[int]
    replan_ms: list[float]
    before_ms: float
    after_ms: float


@dataclass(frozen=True, kw_only=True)
class ReplanRound(Record):
    """The static and the re-planned pipeline side by side; ``recovered_*`` is ``None``
    where the static run kept pace."""

    static: ReplanArm
    replanned: ReplanArm
    before_ms: float
    recovered_step_time: float | None
    recovered_throughput: float | None
    replan_delay_steps: int | None


@dataclass(frozen=True, kw_only=True)
class ReplanRun(Record):
    """One slow-down ``factor`` of rank 1 from step ``start`` on."""

    layers: int
    width: int
    batch: int
    steps: int
    start: int
    factor: float
    rounds: list[ReplanRound]
    recovered_step_time_median: float | None
    recovered_throughput_median: float | None


@dataclass(frozen=True, kw_only=True)
class PpReplan(Result):
    ranks: int
    schedule: str
    runs: list[ReplanRun]


FILES = {"pp_replan": PpReplan}


def _share(known: list[float]) -> str:
    if not known:
        return "-"
    return (f"{pct(statistics.median(known), 0)} "
            f"({pct(min(known), 0)} to {pct(max(known), 0)})")  # fmt: skip


def replan_table() -> str:
    """The static cut against the re-planned one, one row per slow-down factor (medians over
    rounds). The share recovered is given on step time and on throughput (1 / step time),
    each beside what a perfect re-cut could win (one rank ``f`` times slower among ``p``)."""
    data = load_result(PpReplan, "pp_replan")
    p = data.ranks
    rows, early = [], 0
    for run in data.runs:
        rounds, factor, start = run.rounds, run.factor, run.start
        early += sum(1 for r in rounds for k in r.replanned.replanned_at if k < start)
        delays = ", ".join("-" if r.replan_delay_steps is None else str(r.replan_delay_steps)
                           for r in rounds)  # fmt: skip
        switch = [ms for r in rounds for ms in r.replanned.replan_ms]
        step_time = [r.recovered_step_time for r in rounds if r.recovered_step_time is not None]
        throughput = [r.recovered_throughput for r in rounds
                      if r.recovered_throughput is not None]  # fmt: skip
        rows.append([
            f"{factor:g}x", len(rounds),
            f(statistics.median(r.before_ms for r in rounds), 0),
            f(statistics.median(r.static.after_ms for r in rounds), 0),
            f(statistics.median(r.replanned.after_ms for r in rounds), 0),
            _share(step_time), pct((factor - p / (p - 1 + 1 / factor)) / (factor - 1), 0),
            _share(throughput), pct((p - 1) / p, 0), delays,
            f(statistics.median(switch), 0) if switch else "-",
            ", ".join(str(c) for c in sorted({tuple(r.replanned.sizes[-1]) for r in rounds})),
        ])  # fmt: skip
    table = md_table(["rank 1 slow", "rounds", "before ms", "static after ms",
                      "re-planned after ms", "recovered, step time", "ceiling",
                      "recovered, throughput", "ceiling", "re-planned after (steps)",
                      "switch ms", "final cut"], rows)  # fmt: skip
    return (
        f"{table}\n\nMedians over rounds, the range in brackets; {p} gloo ranks. "
        "Re-plans before the straggler began (the first cut's own imbalance, or noise read "
        f"as drift): {early}."
    )


TABLES: dict[str, Renderer] = {"pipeline.replan": replan_table}
