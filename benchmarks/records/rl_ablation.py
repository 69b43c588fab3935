"""``benchmarks/rl_ablation.py``: each lag fix alone and all together, per staleness bound
eta (docs/rl/system.md)."""

from __future__ import annotations

from dataclasses import dataclass

from benchmarks._common import Record, Result, json_key, load_result
from benchmarks.records import Renderer, count, f, md_table, prose

MARGIN = 0.1  # accuracy steps are 1/21 here: a gain of one or two prompts is noise


@dataclass(frozen=True, kw_only=True)
class AblationSetup(Record):
    steps: int
    etas: str
    seed: int
    trainer_delay_s: float
    task: str
    mode: str


@dataclass(frozen=True, kw_only=True)
class AblationRow(Record):
    """One fix at one eta; ``curve``: (wall seconds, accuracy) points."""

    fix: str
    eta: int
    steps: int
    wall_s: float
    final_accuracy: float
    best_accuracy: float
    t_to_0_9_s: float | None = json_key("t_to_0.9_s")
    samples_per_s: float
    dropped_stale: int
    reused: int
    staleness_max: int
    ledger_ok: bool
    curve: list[list[float]]


@dataclass(frozen=True, kw_only=True)
class RlAblation(Result):
    setup: AblationSetup
    rows: list[AblationRow]


FILES = {"rl_ablation": RlAblation}


def _t90(value: float | None) -> str:
    return "-" if value is None else f(value)


def _note(eta: int, rows: list[AblationRow]) -> str:
    mine = [r for r in rows if r.eta == eta]
    naive = next(r for r in mine if r.fix == "naive PPO")
    better = [r.fix for r in mine if r.fix != "naive PPO"
              and r.final_accuracy >= naive.final_accuracy + MARGIN]  # fmt: skip
    return (
        f"At eta {eta}, naive PPO ends at {naive.final_accuracy:.3f}; "
        + (f"{', '.join(better)} end" if better else "no fix ends")
        + f" at least {MARGIN} higher."
    )


def ablation() -> str:
    """Each lag fix alone and all together, per eta."""
    data = load_result(RlAblation, "rl_ablation")
    setup, rows = data.setup, data.rows
    table = md_table(
        ["fix", "eta", "final acc", "best acc", "time to 0.9 s", "samples/s", "dropped stale",
         "reused"],
        [[r.fix, r.eta, f(r.final_accuracy, 3), f(r.best_accuracy, 3), _t90(r.t_to_0_9_s),
          count(r.samples_per_s), count(r.dropped_stale), count(r.reused)] for r in rows],
    )  # fmt: skip
    notes = [_note(eta, rows) for eta in sorted({r.eta for r in rows})]
    head = (
        f"{setup.mode}, digits, {setup.steps} trainer steps per run, trainer "
        f"+{setup.trainer_delay_s} s per step, seed {setup.seed}, one run per cell."
    )
    return f"{table}\n\n{prose(head, *notes)}"


TABLES: dict[str, Renderer] = {"rl.ablation": ablation}
