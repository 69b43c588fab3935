"""The README's headline table: one line per part, each figure read from its benchmark's
record."""

from __future__ import annotations

from benchmarks._common import load_result
from benchmarks.records import Renderer, md_table, pct, times
from benchmarks.records.ep_transports import EpTransports
from benchmarks.records.eplb_balance import EplbBalance
from benchmarks.records.ilp_scaling import IlpScaling
from benchmarks.records.pp_runtime import PpRuntime
from benchmarks.records.rl_modes import ThroughputRow
from benchmarks.records.zb_paper_table import ZbPaperTable

_PRETTY = {"1f1b": "1F1B", "zb-h1": "ZB-H1", "zb-h2": "ZB-H2", "zb-1p": "ZB-1p", "zb-2p": "ZB-2p"}


def _paper_row() -> list[str]:
    rows = load_result(ZbPaperTable, "zb_paper_table").rows
    cell = next(r for r in rows if (r.model, r.p, r.m) == ("1.5B", 8, 24)).schedules
    worst = max(abs(s.diff) for r in rows for s in r.schedules.values())
    cells = sum(len(r.schedules) for r in rows)
    return [
        "pipeline schedules",
        "bubble rate, P=8, M=24, the Zero Bubble paper's 1.5B costs",
        f"1F1B {pct(cell['1f1b'].ours)}",
        f"ZB-2p {pct(cell['zb-2p'].ours)}; all {cells} cells of the paper's table within "
        f"{100 * worst:.3f} points",
        "`zb_paper_table.json`",
    ]


def _ilp_row() -> list[str]:
    best = max(load_result(IlpScaling, "ilp_scaling").memory_sweep,
               key=lambda r: r.span_reduction or 0.0)  # fmt: skip
    if best.span_reduction is None:
        raise ValueError("ilp_scaling.json: the ILP found no schedule in the memory sweep")
    return [
        "exact solver (CP-SAT)",
        f"span, P={best.p}, M={best.m}, memory limit {best.mem_limit_MF} M_F",
        f"{_PRETTY.get(best.heuristic, best.heuristic)} heuristic",
        f"{pct(best.span_reduction)} shorter, {best.status}",
        "`ilp_scaling.json`",
    ]


def _runtime_row() -> list[str]:
    data = load_result(PpRuntime, "pp_runtime")
    by_name = {s.schedule: s for s in data.schedules}
    gains = ", ".join(
        f"{_PRETTY.get(name, name)} {times(s.measured_speedup_step)}"
        for name, s in by_name.items()
        if name != "1f1b"
    )
    return [
        "pipeline runtime",
        f"step time, GPT on {data.ranks} gloo ranks, M={data.num_microbatches}",
        "1F1B",
        f"{gains} faster",
        "`pp_runtime.json`",
    ]


def _moe_row() -> list[str]:
    tr = load_result(EpTransports, "ep_transports").transports
    if tr is None:
        raise ValueError("ep_transports.json lacks transports: run benchmarks.ep_transports")
    s = tr.shape
    return [
        "MoE dispatch + combine",
        f"{s.ranks} ranks, {s.tokens} x {s.hidden} {s.dtype}, top-{s.topk} of {s.experts}",
        "gloo all-to-all",
        f"shared memory {times(tr.speedup_shm_over_gloo)} faster"
        + (", bit-equal" if tr.bit_equal else ", NOT bit-equal"),
        "`ep_transports.json`",
    ]


def _eplb_row() -> list[str]:
    data = load_result(EplbBalance, "eplb_balance")
    row, c = data.balance[0], data.config
    return [
        "MoE load balancing",
        f"GPU load max/mean, {row.skew} expert loads, {c.experts} experts on {c.gpus} GPUs",
        f"DeepSeek's EPLB {row.imbalance_eplb:.2f}",
        f"{row.imbalance_ours:.2f} (no balance: {row.imbalance_none:.2f})",
        "`eplb_balance.json`",
    ]


def _rl_row() -> list[str]:
    rows = {r.mode: r for r in load_result(list[ThroughputRow], "rl_modes_throughput")}
    return [
        "asynchronous RL",
        "training samples per second",
        "synchronous",
        f"one-step-off {times(rows['one-step-off'].speedup)}, "
        f"fully-async {times(rows['fully-async'].speedup)}",
        "`rl_modes_throughput.json`",
    ]


def headline() -> str:
    rows = [_paper_row(), _ilp_row(), _runtime_row(), _moe_row(), _eplb_row(), _rl_row()]
    return md_table(["part", "measured", "baseline", "result", "from"], rows, align="lllll")


TABLES: dict[str, Renderer] = {"headline": headline}
