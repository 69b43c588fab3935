"""The partial-rollouts tables of docs/rl/system.md, from ``rl_partial_rollouts.json``."""

from __future__ import annotations

import statistics
from typing import Any

from scripts.tables import f, load, md_table, pct, times
from scripts.tables.rl import _int, _prose

PAIRS = [(d, v) for d in ("fast", "slow") for v in ("whole-group", "partial")]


def _runs(rows: list[dict[str, Any]], decoder: str, versioning: str) -> list[dict[str, Any]]:
    return [r for r in rows if r["decoder"] == decoder and r["versioning"] == versioning]


def _pooled(runs: list[dict[str, Any]]) -> dict[int, int]:
    """Trained tokens by staleness, summed over the runs."""
    out: dict[int, int] = {}
    for r in runs:
        for lag, n in r["token_staleness_hist"].items():
            out[int(lag)] = out.get(int(lag), 0) + n
    return out


def _mean_lag(hist: dict[int, int]) -> float:
    return sum(k * n for k, n in hist.items()) / max(1, sum(hist.values()))


def partial_rollouts() -> str:
    """Summary, per-token staleness histogram and a note (``rl_partial_rollouts.json``)."""
    data = load("rl_partial_rollouts.json")
    setup, rows = data["setup"], data["rows"]
    pairs = [(d, v, _runs(rows, d, v)) for d, v in PAIRS if _runs(rows, d, v)]

    def rate(runs: list[dict[str, Any]]) -> float:
        return statistics.median(r["samples_per_s"] for r in runs)

    summary = md_table(
        ["decoder", "versioning", "seeds", "samples/s (median)", "vs whole-group",
         "final acc", "best acc", "t to 0.9 s", "mean token lag", "calls updated mid-response"],
        [
            [
                d, v, len(runs), _int(rate(runs)),
                times(rate(runs) / rate(_runs(rows, d, "whole-group"))),
                ", ".join(f(r["final_accuracy"], 3) for r in runs),
                ", ".join(f(r["best_accuracy"], 3) for r in runs),
                ", ".join("-" if r["t_to_0.9_s"] is None else f(r["t_to_0.9_s"]) for r in runs),
                f(_mean_lag(_pooled(runs)), 2),
                f"{sum(r['updated_mid_response'] for r in runs):,} of "
                f"{sum(r['generate_calls'] for r in runs):,}",
            ]
            for d, v, runs in pairs
        ],
    )  # fmt: skip
    hists = [(d, v, _pooled(runs)) for d, v, runs in pairs]
    lags = range(max(max(h, default=0) for _, _, h in hists) + 1)
    hist = md_table(
        ["decoder", "versioning", *(f"lag {k}" for k in lags)],
        [
            [d, v, *(pct(h.get(k, 0) / max(1, sum(h.values())), 1) for k in lags)]
            for d, v, h in hists
        ],
    )
    delay = setup["token_delay"]
    note = (
        f"Digits, fully-async, max staleness {setup['max_staleness']}, trainer "
        f"+{setup['trainer_delay']} s per step, GRPO without other lag fixes, "
        f"{setup['budget']:.0f} s per run, seeds {', '.join(map(str, setup['seeds']))}. fast: "
        "the ablation's generator (one group per call, no delay); slow: one batch of 8 "
        f"groups per call and +{delay} s per decoding step. Lag histogram: share of the "
        "trained response tokens by trainer version minus the version that produced them, "
        "pooled over seeds."
    )
    return f"{summary}\n\n{hist}\n\n{_prose(note)}"


TABLES = {"rl.partial_rollouts": partial_rollouts}
