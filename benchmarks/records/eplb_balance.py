"""``benchmarks/eplb_balance.py``: DeepSeek's EPLB against nobubble's placement, incremental
and periodic rebalancing, and online rebalancing on gloo ranks (docs/moe/balance.md, and the
README's headline)."""

from __future__ import annotations

from dataclasses import dataclass

from benchmarks._common import Record, Result, load_result
from benchmarks.records import Renderer, f, md_table


@dataclass(frozen=True, kw_only=True)
class EplbConfig(Record):
    experts: int
    groups: int
    nodes: int
    gpus: int
    redundant: int
    layers: int


@dataclass(frozen=True, kw_only=True)
class BalanceRow(Record):
    """One load skew: max / mean GPU load without redundancy, with EPLB, with ours."""

    skew: str
    imbalance_none: float
    imbalance_eplb: float
    imbalance_ours: float
    worst_layer_eplb: float
    worst_layer_ours: float
    dup_gpus_per_layer_eplb: float
    dup_gpus_per_layer_ours: float
    ms_per_layer_eplb: float
    ms_per_layer_ours: float


@dataclass(frozen=True, kw_only=True)
class DriftRow(Record):
    """One drift of the loads: the stale, a fresh and an incremental placement."""

    drift_sigma: float
    imbalance_stale: float
    imbalance_fresh: float
    imbalance_incremental: float
    moved_fresh: float
    moved_incremental: float
    moved_eplb_fresh: float


@dataclass(frozen=True, kw_only=True)
class Periodic(Record):
    """Per periodic rebalance: experts moved and max / mean load, fresh and incremental."""

    moved_fresh: list[float]
    moved_incremental: list[float]
    imb_fresh: list[float]
    imb_incremental: list[float]


@dataclass(frozen=True, kw_only=True)
class OnlineConfig(Record):
    hidden: int
    expert_hidden: int
    experts: int
    physical: int
    ranks: int


@dataclass(frozen=True, kw_only=True)
class OnlineResult(Record):
    mode: str
    moved_per_rebalance: float
    mb_sent_per_rebalance: float
    ms_median: float
    imbalance_after: float
    imbalance_stale: float


@dataclass(frozen=True, kw_only=True)
class Online(Record):
    config: OnlineConfig
    results: list[OnlineResult]


@dataclass(frozen=True, kw_only=True)
class EplbBalance(Result):
    config: EplbConfig
    balance: list[BalanceRow]
    incremental_once: list[DriftRow]
    periodic: Periodic
    online: Online
    images: list[str]


FILES = {"eplb_balance": EplbBalance}


def _skew(name: str) -> str:
    """``zipf:1`` -> ``Zipf 1.0``, ``pareto:1.5`` -> ``Pareto 1.5``."""
    kind, _, param = name.partition(":")
    return f"{kind.capitalize()} {float(param):.1f}"


def eplb_balance() -> str:
    """Max / mean GPU load, EPLB vs nobubble."""
    data = load_result(EplbBalance, "eplb_balance").balance
    rows = [
        [_skew(r.skew), f(r.imbalance_none, 3),
         f"{f(r.imbalance_eplb, 3)} ({f(r.worst_layer_eplb, 3)})",
         f"**{f(r.imbalance_ours, 3)} ({f(r.worst_layer_ours, 3)})**",
         f(r.dup_gpus_per_layer_eplb), f"{r.dup_gpus_per_layer_ours:g}"]
        for r in data
    ]  # fmt: skip
    table = md_table(
        ["loads", "no redundancy", "EPLB (original)", "nobubble",
         "EPLB: GPUs with an expert twice, per layer", "nobubble"],
        rows,
        align="llllll",
    )  # fmt: skip
    ours = [r.ms_per_layer_ours for r in data]
    ref = [r.ms_per_layer_eplb for r in data]
    return (
        f"{table}\n\nPlacement time per layer, median: {f(min(ours), 0)}-{f(max(ours), 0)} ms "
        f"(nobubble, pure Python) vs {f(min(ref), 0)}-{f(max(ref), 0)} ms (the reference, torch "
        f"ops in Python loops)."
    )


def eplb_incremental() -> str:
    """Stale / fresh / incremental placement after one drift."""
    data = load_result(EplbBalance, "eplb_balance")
    physical = data.config.experts + data.config.redundant
    rows = [
        [f"{r.drift_sigma:g}", f(r.imbalance_stale, 3), f(r.imbalance_fresh, 3),
         f(r.imbalance_incremental, 3), f(r.moved_fresh), f"**{f(r.moved_incremental)}**"]
        for r in data.incremental_once
    ]  # fmt: skip
    return md_table(
        ["drift sigma", "stale placement", "fresh", "incremental",
         f"moved, fresh (of {physical})", "moved, incremental"],
        rows,
        align="llllll",
    )  # fmt: skip


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs)


def eplb_periodic() -> str:
    """Periodic rebalances and online rebalancing on gloo ranks."""
    data = load_result(EplbBalance, "eplb_balance")
    per = data.periodic
    periodic = md_table(
        ["rebalance", "experts moved per layer, mean", "max / mean GPU load, mean"],
        [["fresh", f(_mean(per.moved_fresh)), f(_mean(per.imb_fresh), 3)],
         ["incremental", f(_mean(per.moved_incremental)), f(_mean(per.imb_incremental), 3)]],
    )  # fmt: skip
    online = md_table(
        ["online rebalance", "experts moved", "MiB sent", "ms, median",
         "max / mean, stale placement", "max / mean after"],
        [[r.mode, f"{r.moved_per_rebalance:g}", f(r.mb_sent_per_rebalance), f(r.ms_median, 0),
          f(r.imbalance_stale, 3), f(r.imbalance_after, 3)] for r in data.online.results],
    )  # fmt: skip
    c = data.online.config
    return (
        f"{len(per.moved_fresh)} periodic rebalances:\n\n{periodic}\n\nOnline, on {c.ranks} "
        f"gloo ranks ({c.experts} experts -> {c.physical} physical, H={c.hidden}, "
        f"I={c.expert_hidden}, weights + Adam state), per rebalance:\n\n{online}"
    )


TABLES: dict[str, Renderer] = {
    "moe.eplb_balance": eplb_balance,
    "moe.eplb_incremental": eplb_incremental,
    "moe.eplb_periodic": eplb_periodic,
}
