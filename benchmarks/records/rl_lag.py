"""``benchmarks/rl_lag.py``: the conservative and aggressive presets against naive PPO under
policy lag, with a slow trainer (docs/rl/algorithms.md)."""

from __future__ import annotations

from dataclasses import dataclass

from benchmarks._common import Record, Result, json_key, load_result
from benchmarks.records import Renderer, count, f, md_table, prose


@dataclass(frozen=True, kw_only=True)
class LagSetup(Record):
    """The benchmark's flags."""

    seeds: list[int]
    budget: float
    trainer_delay: float
    max_staleness: int


@dataclass(frozen=True, kw_only=True)
class LagRow(Record):
    """One run (``run``: preset or naive PPO, and seed)."""

    run: str
    preset: str | None
    algo: str
    max_staleness: int
    steps: int
    wall_s: float
    samples_per_s: float
    final_accuracy: float
    t_to_0_9_s: float | None = json_key("t_to_0.9_s")
    staleness_max: int
    reused: int
    ledger_ok: bool


@dataclass(frozen=True, kw_only=True)
class RlLag(Result):
    setup: LagSetup
    rows: list[LagRow]


FILES = {"rl_lag": RlLag}


def lag() -> str:
    """The presets against naive PPO under lag, with a slow trainer."""
    data = load_result(RlLag, "rl_lag")
    setup, rows = data.setup, data.rows
    table = md_table(
        ["run", "algo", "max lag", "steps", "final acc", "time to 0.9 s", "samples/s", "reused"],
        [[r.run, r.algo, r.staleness_max, r.steps, f(r.final_accuracy, 3),
          "-" if r.t_to_0_9_s is None else f(r.t_to_0_9_s), count(r.samples_per_s),
          count(r.reused)] for r in rows],
    )  # fmt: skip
    budget = setup.budget

    def met(prefix: str) -> str:
        mine = [r for r in rows if r.run.startswith(prefix)]
        ok = sum(r.t_to_0_9_s is not None and r.t_to_0_9_s <= budget for r in mine)
        return f"{prefix} reached 0.9 within {budget:.0f} s on {ok} of {len(mine)} seeds"

    note = (
        f"Digits, trainer +{setup.trainer_delay} s per step, max staleness "
        f"{setup.max_staleness} for the aggressive preset and naive PPO; a run stops at "
        f"0.9 accuracy or after {budget:.0f} s. {met('aggressive')}; {met('conservative')}; "
        f"{met('naive PPO')}."
    )
    return f"{table}\n\n{prose(note)}"


TABLES: dict[str, Renderer] = {"rl.lag": lag}
