"""``benchmarks/rl_partial_rollouts.py``: whole-group against partial (per-token) policy
versions, with a fast and a slow decoder (docs/rl/system.md)."""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from benchmarks._common import Record, Result, json_key, load_result
from benchmarks.records import Renderer, count, f, md_table, pct, prose, times


@dataclass(frozen=True, kw_only=True)
class PartialSetup(Record):
    """The benchmark's flags and the fixed settings of every run."""

    seeds: list[int]
    budget: float
    trainer_delay: float
    token_delay: float
    max_staleness: int
    decoders: list[str]
    task: str
    mode: str
    algo: str
    groups_per_rollout: dict[str, int]


@dataclass(frozen=True, kw_only=True)
class PartialRow(Record):
    """One run; the histograms: trained tokens (groups) by staleness, keyed by the lag."""

    decoder: str
    versioning: str
    seed: int
    steps: int
    wall_s: float
    samples_per_s: float
    final_accuracy: float
    best_accuracy: float
    t_to_0_9_s: float | None = json_key("t_to_0.9_s")
    token_staleness_hist: dict[str, int]
    token_lag_mean: float
    group_staleness_hist: dict[str, int]
    generate_calls: int
    updated_mid_response: int
    dropped_stale: int
    ledger_ok: bool


@dataclass(frozen=True, kw_only=True)
class RlPartialRollouts(Result):
    setup: PartialSetup
    rows: list[PartialRow]


FILES = {"rl_partial_rollouts": RlPartialRollouts}

PAIRS = [(d, v) for d in ("fast", "slow") for v in ("whole-group", "partial")]


def _runs(rows: list[PartialRow], decoder: str, versioning: str) -> list[PartialRow]:
    return [r for r in rows if r.decoder == decoder and r.versioning == versioning]


def _pooled(runs: list[PartialRow]) -> dict[int, int]:
    """Trained tokens by staleness, summed over the runs."""
    out: dict[int, int] = {}
    for r in runs:
        for lag, n in r.token_staleness_hist.items():
            out[int(lag)] = out.get(int(lag), 0) + n
    return out


def _mean_lag(hist: dict[int, int]) -> float:
    return sum(k * n for k, n in hist.items()) / max(1, sum(hist.values()))


def _rate(runs: list[PartialRow]) -> float:
    return statistics.median(r.samples_per_s for r in runs)


def _summary_row(rows: list[PartialRow], d: str, v: str, runs: list[PartialRow]) -> list[object]:
    return [
        d, v, len(runs), count(_rate(runs)), times(_rate(runs) / _rate(_runs(rows, d, "whole-group"))),
        ", ".join(f(r.final_accuracy, 3) for r in runs),
        ", ".join(f(r.best_accuracy, 3) for r in runs),
        ", ".join("-" if r.t_to_0_9_s is None else f(r.t_to_0_9_s) for r in runs),
        f(_mean_lag(_pooled(runs)), 2),
        f"{sum(r.updated_mid_response for r in runs):,} of "
        f"{sum(r.generate_calls for r in runs):,}",
    ]  # fmt: skip


def partial_rollouts() -> str:
    """Summary, per-token staleness histogram and a note."""
    data = load_result(RlPartialRollouts, "rl_partial_rollouts")
    setup, rows = data.setup, data.rows
    pairs = [(d, v, _runs(rows, d, v)) for d, v in PAIRS if _runs(rows, d, v)]
    summary = md_table(
        ["decoder", "versioning", "seeds", "samples/s (median)", "vs whole-group",
         "final acc", "best acc", "t to 0.9 s", "mean token lag", "calls updated mid-response"],
        [_summary_row(rows, d, v, runs) for d, v, runs in pairs],
    )  # fmt: skip
    hists = [(d, v, _pooled(runs)) for d, v, runs in pairs]
    lags = range(max(max(h, default=0) for _, _, h in hists) + 1)
    hist = md_table(
        ["decoder", "versioning", *(f"lag {k}" for k in lags)],
        [[d, v, *(pct(h.get(k, 0) / max(1, sum(h.values())), 1) for k in lags)]
         for d, v, h in hists],
    )  # fmt: skip
    note = (
        f"Digits, fully-async, max staleness {setup.max_staleness}, trainer "
        f"+{setup.trainer_delay} s per step, GRPO without other lag fixes, "
        f"{setup.budget:.0f} s per run, seeds {', '.join(map(str, setup.seeds))}. fast: "
        "the ablation's generator (one group per call, no delay); slow: one batch of 8 "
        f"groups per call and +{setup.token_delay} s per decoding step. Lag histogram: share "
        "of the trained response tokens by trainer version minus the version that produced "
        "them, pooled over seeds."
    )
    return f"{summary}\n\n{hist}\n\n{prose(note)}"


TABLES: dict[str, Renderer] = {"rl.partial_rollouts": partial_rollouts}
