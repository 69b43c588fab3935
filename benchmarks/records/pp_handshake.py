"""``benchmarks/pp_handshake.py``: the handshake dispatch policy against the static orders,
exact, under jitter and under a straggler (docs/pipeline/handshake.md)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from benchmarks._common import Record, Result, load_result, optional
from benchmarks.records import Renderer, md_table, pct


@dataclass(frozen=True, kw_only=True)
class HandshakeRule(Record):
    window: int
    profile_weight: float
    bottleneck_margin: float


@dataclass(frozen=True, kw_only=True)
class DispatchRun(Record):
    """One simulated run (jitter: the mean over the seeds); memory in M_F."""

    bubble_rate: float
    makespan: float
    peak_memory_MF: float
    limit_MF: float
    deviations: float


@dataclass(frozen=True, kw_only=True)
class HandshakeCase(Record):
    """The static order against the handshake on one perturbation; ``per_seed``:
    (static, handshake) bubble rates per jitter seed."""

    static: DispatchRun
    handshake: DispatchRun
    bubble_gap: float
    goal_met: bool
    per_seed: list[list[float]] | None = optional()


@dataclass(frozen=True, kw_only=True)
class HandshakeRow(Record):
    """One configuration: plan -> perturbation -> case."""

    model: str
    p: int
    m: int
    plans: dict[str, dict[str, HandshakeCase]]
    goal_met: bool
    seconds: float


@dataclass(frozen=True, kw_only=True)
class PpHandshake(Result):
    note: str
    jitter: float
    seeds: list[int]
    straggler_factor: float
    exact_tolerance: float
    rule: HandshakeRule
    all_goals_met: bool
    rows: list[HandshakeRow]


FILES = {"pp_handshake": PpHandshake}

_PLANS = {"zb-h1": "ZB-H1", "zb-2p": "ZB-2p"}
_CASES = (("none", "exact"), ("jitter", "jitter"), ("straggler", "straggler"))


def _gap_range(values: Sequence[float]) -> str:
    low, high = min(values), max(values)
    return (
        f"{100 * low:+.2f}" if abs(high - low) < 5e-5 else f"{100 * low:+.2f} to {100 * high:+.2f}"
    )


def handshake_table() -> str:
    """The static order's bubble rate beside the handshake's (jitter: mean of the seeds) per
    configuration and plan, then what the rows say."""
    data = load_result(PpHandshake, "pp_handshake")
    rows = []
    for r in data.rows:
        cells: list[object] = [r.model, r.p, r.m]
        for plan in _PLANS:
            for case, _ in _CASES:
                c = r.plans[plan][case]
                cells.append(f"{pct(max(c.static.bubble_rate, 0.0), 2)} / "
                             f"{pct(max(c.handshake.bubble_rate, 0.0), 2)}")  # fmt: skip
        cells.append("yes" if r.goal_met else "**no**")
        rows.append(cells)
    headers = ["model", "p", "m"]
    headers += [f"{_PLANS[plan]} {label}" for plan in _PLANS for _, label in _CASES]
    table = md_table([*headers, "goal met"], rows)
    plans = [r.plans[plan] for r in data.rows for plan in _PLANS]
    seeds = [b - a for p in plans for a, b in p["jitter"].per_seed or []]
    worse = sum(g > 1e-12 for g in seeds)

    def gaps(case: str, plan: str | None = None) -> str:
        chosen = [r.plans[plan] for r in data.rows] if plan else plans
        return _gap_range([p[case].bubble_gap for p in chosen])

    def makespans(case: str, plan: str) -> str:
        cases = [r.plans[plan][case] for r in data.rows]
        return _gap_range([c.handshake.makespan / c.static.makespan - 1 for c in cases])

    met = sum(r.goal_met for r in data.rows)
    return (
        f"{table}\n\nThe goal is met on {met} of {len(data.rows)} rows. Handshake minus static, "
        f"in points of bubble: exact {gaps('none')}; jitter {data.jitter:g} (mean of "
        f"{len(data.seeds)} seeds) {gaps('jitter')}, where {worse} of the {len(seeds)} single "
        f"seeds come out worse (by at most {100 * max(seeds):.2f}); straggler x"
        f"{data.straggler_factor:g} on rank p/2: ZB-H1 {gaps('straggler', 'zb-h1')} (makespan "
        f"{makespans('straggler', 'zb-h1')}%), ZB-2p {gaps('straggler', 'zb-2p')} (makespan "
        f"{makespans('straggler', 'zb-2p')}%); the straggler on rank 0 instead "
        f"{gaps('straggler_first')}, on rank p-1 {gaps('straggler_last')}. Every run stayed "
        "within its memory limit, the static order's own peak on each rank (the benchmark "
        "checks it)."
    )


TABLES: dict[str, Renderer] = {"pipeline.handshake": handshake_table}
