"""``benchmarks/rl_learners.py``: one learner against two with each aggregation mode
(docs/rl/system.md)."""

from __future__ import annotations

from dataclasses import dataclass

from benchmarks._common import Record, Result, json_key, load_result
from benchmarks.records import Renderer, count, f, md_table, prose


@dataclass(frozen=True, kw_only=True)
class LearnersSetup(Record):
    seeds: list[int]
    budget_s: float
    mode: str
    max_staleness: int
    task: str


@dataclass(frozen=True, kw_only=True)
class LearnersRow(Record):
    """One run (``run``: the aggregation mode); ``by_learner``: samples per learner id."""

    run: str
    seed: int
    learners: int
    steps: int
    wall_s: float
    t_to_0_9_s: float | None = json_key("t_to_0.9_s")
    final_accuracy: float
    best_accuracy: float
    samples_per_s: float
    by_learner: dict[str, int]
    push_staleness_max: float
    ledger_ok: bool


@dataclass(frozen=True, kw_only=True)
class RlLearners(Result):
    setup: LearnersSetup
    rows: list[LearnersRow]


FILES = {"rl_learners": RlLearners}


def _row(r: LearnersRow) -> list[object]:
    return [
        r.run, r.seed, r.learners, r.steps, "-" if r.t_to_0_9_s is None else f(r.t_to_0_9_s),
        f(r.final_accuracy, 3), count(r.samples_per_s),
        " / ".join(count(v) for _, v in sorted(r.by_learner.items())),
        "-" if r.learners == 1 or r.run in ("sync", "local-sgd")
        else f"{r.push_staleness_max:.0f}",
    ]  # fmt: skip


def learners() -> str:
    """One learner against two with each aggregation mode."""
    data = load_result(RlLearners, "rl_learners")
    setup, rows = data.setup, data.rows
    table = md_table(
        ["run", "seed", "learners", "steps", "time to 0.9 s", "final acc", "samples/s",
         "samples per learner", "push staleness max"],
        [_row(r) for r in rows],
    )  # fmt: skip
    reached: dict[str, list[bool]] = {}
    for r in rows:
        reached.setdefault(r.run, []).append(r.t_to_0_9_s is not None)
    summary = "; ".join(f"{run}: {sum(v)} of {len(v)}" for run, v in reached.items())
    note = (
        f"{setup.mode} (max staleness {setup.max_staleness}), {setup.task}, GRPO, "
        f"8 groups x 32 responses per step; a run stops at 0.9 or after {setup.budget_s:.0f} s. "
        f"Runs reaching 0.9: {summary}."
    )
    return f"{table}\n\n{prose(note)}"


TABLES: dict[str, Renderer] = {"rl.learners": learners}
