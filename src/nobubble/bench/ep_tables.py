"""Tables of the MoE measurements: ``ep bench``'s report (:mod:`nobubble.bench.ep_dispatch`)
and the fast-path sections (:mod:`nobubble.bench.ep_fastpath` results)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from nobubble.bench.ep_fastpath import TRANSPORT_PATHS
from nobubble.bench.output import console, print_table

__all__ = [
    "print_balance_report",
    "print_dispatch_report",
    "print_bench_reports",
    "print_transports",
    "print_hierarchical",
    "print_low_latency",
    "print_overlap",
    "print_train_report",
]


DISPATCH_COLUMNS = (
    ("dispatch ms", "dispatch_ms", 1),
    ("combine ms", "combine_ms", 1),
    ("disp GB/s", "dispatch_logical_gbps", 1),
    ("comb GB/s", "combine_logical_gbps", 1),
    ("disp MB", "dispatch_payload_bytes", 1e-6),
    ("remote MB", "dispatch_remote_bytes", 1e-6),
    ("meta MB", "dispatch_metadata_bytes", 1e-6),
    ("comb MB", "combine_payload_bytes", 1e-6),
)
"""``(header, field of a MethodResult, scale)``: the columns of ``ep bench``'s table."""


def print_dispatch_report(report: Any) -> None:
    """``ep bench``'s table of one :class:`~nobubble.bench.ep_dispatch.BenchReport` (MB = 1e6
    bytes, summed over ranks; GB/s per rank)."""
    c, base = report.config, report.methods[0]
    ratios = ", ".join(
        f"{m.method}: dispatch x{m.dispatch_ms / base.dispatch_ms:.2f}, combine x{m.combine_ms / base.combine_ms:.2f}"
        for m in report.methods[1:]
    )
    print_table(
        f"ep bench: {c.num_ranks} ranks x {c.num_tokens} tokens x {c.hidden} {c.dtype}, top-"
        f"{c.topk} of {c.num_experts} experts, {report.transport} transport (median of "
        f"{c.num_iters}, slowest rank)",
        ["method", *(header for header, _, _ in DISPATCH_COLUMNS), "check"],
        [
            [m.method, *(getattr(m, key) * scale for _, key, scale in DISPATCH_COLUMNS), m.verdict]
            for m in report.methods
        ],
        caption=f"logical bytes {report.logical_bytes / 1e6:.1f} MB (sum(is_token_in_rank)*H*es); "
        f"time relative to buffer - {ratios}",
    )


def print_bench_reports(reports: list[Any]) -> None:
    """``ep bench``'s tables of ``reports`` (:class:`~nobubble.bench.ep_dispatch.BenchReport`,
    one per transport, ``buffer`` first in each): each one's, then with several transports
    Buffer's times over each, relative to the first transport."""
    for report in reports:
        print_dispatch_report(report)
    if len(reports) < 2:
        return
    first = reports[0].methods[0]
    print_table(
        "ep bench: Buffer over each transport (median, slowest rank)",
        ["transport", "dispatch ms", "combine ms", "dispatch vs first", "combine vs first"],
        [
            [r.transport, b.dispatch_ms, b.combine_ms, f"x{b.dispatch_ms / first.dispatch_ms:.2f}",
             f"x{b.combine_ms / first.combine_ms:.2f}"]
            for r in reports
            for b in r.methods[:1]
        ],
    )  # fmt: skip


Column = tuple[str, str, str]
"""``(header, key of a result row, format)``: one column of a fast-path table."""

TRANSPORT_COLUMNS: tuple[Column, ...] = (
    ("dispatch ms", "dispatch_ms", "{:.1f}"),
    ("combine ms", "combine_ms", "{:.1f}"),
    ("disp GB/s/rank", "dispatch_gbps_per_rank", "{:.2f}"),
    ("comb GB/s/rank", "combine_gbps_per_rank", "{:.2f}"),
    ("aggregate GB/s", "aggregate_gbps", "{:.2f}"),
    ("x memcpy", "fraction_of_memcpy", "{:.2f}"),
)
LOW_LATENCY_COLUMNS: tuple[Column, ...] = (
    ("dispatch us", "dispatch_us", "{:.0f}"),
    ("combine us", "combine_us", "{:.0f}"),
    ("dispatch bytes (remote, all ranks)", "dispatch_bytes_all_ranks", "{}"),
)
OVERLAP_COLUMNS: tuple[Column, ...] = (
    ("step ms", "step_ms", "{:.1f}"),
    ("comm ms", "comm_ms", "{:.1f}"),
    ("experts ms", "experts_ms", "{:.1f}"),
    ("comm hidden", "communication_hidden", "{:.0%}"),
    ("speedup", "speedup_vs_no_overlap", "{:.2f}x"),
)


def _print_rows(
    title: str, keys: list[str], columns: tuple[Column, ...], rows: Any, caption: str
) -> None:
    """A table of ``rows`` (``(key cells, result row)`` pairs), formatted per ``columns``."""
    headers = [*keys, *(header for header, _, _ in columns)]
    cells = [[*names, *(spec.format(r[key]) for _, key, spec in columns)] for names, r in rows]
    print_table(title, headers, cells, caption=caption)


def print_transports(res: dict[str, Any]) -> None:
    _print_rows(
        "dispatch + combine (CPU measurement)",
        ["path"],
        TRANSPORT_COLUMNS,
        [([name], r) for name, r in res["rows"].items()],
        f"{res['shape']}; single-core memcpy {res['memcpy_gbps_single_core']:.2f} GB/s; "
        f"shm speedup {res['speedup_shm_over_gloo']:.1f}x; bit-equal: {res['bit_equal']}; "
        + "; ".join(f"{k}: {v}" for k, v in TRANSPORT_PATHS.items()),
    )


def print_hierarchical(res: dict[str, Any]) -> None:
    h, f = res["inter_node_bytes_hierarchical"], res["inter_node_bytes_flat"]
    _print_rows(
        "hierarchical dispatch, 2 nodes x 2 ranks (CPU measurement)",
        ["mode", "inter-node bytes (dispatch)"],
        TRANSPORT_COLUMNS[:2],
        [([name, str(b)], res["rows"][name]) for name, b in (("flat", f), ("hierarchical", h))],
        f"{res['shape']}; distinct (token, other node) pairs "
        f"{res['distinct_token_node_pairs']} x H x 2 B == hierarchical bytes: "
        f"{res['formula_holds']}; hierarchical/flat = {h / f:.3f}",
    )


def print_low_latency(res: dict[str, Any]) -> None:
    _print_rows(
        "low-latency vs normal mode (CPU measurement)",
        ["mode"],
        LOW_LATENCY_COLUMNS,
        [([name], r) for name, r in res["rows"].items()],
        f"{res['shape']}; FP8 / bf16 dispatch bytes = {res['fp8_over_bf16_bytes']:.3f}",
    )


def print_overlap(res: dict[str, Any]) -> None:
    _print_rows(
        "MoE layer forward step, chunked overlap (CPU measurement)",
        ["transport", "mode"],
        OVERLAP_COLUMNS,
        [([t, mode], r) for t, rows in res["rows"].items() for mode, r in rows.items()],
        str(res["shape"]),
    )


BALANCE_SUMMARY = (
    ("imbalance_before", "max/mean before"),
    ("imbalance", "max/mean after"),
    ("duplicate_gpus", "GPUs with an expert twice"),
    ("eplb_original_imbalance", "EPLB original max/mean"),
    ("eplb_original_duplicate_gpus", "EPLB: GPUs with an expert twice"),
)
"""``ep balance``'s per-layer summary table: (report key, column)."""


def print_balance_report(r: dict[str, Any]) -> None:
    """``ep balance``'s tables of a :class:`~nobubble.moe.balance.report.BalanceReport`'s
    ``to_dict()``: layer 0's GPUs (load before / after, experts), each layer's imbalance."""
    gpn, counts = r["gpus"] // r["nodes"], r["logcnt"][0]
    rows = [[g, g // gpn, r["gpu_load_before"][0][g], r["gpu_load_after"][0][g],
             " ".join(f"{e}" + ("*" if counts[e] > 1 else "") for e in experts)]
            for g, experts in enumerate(r["gpu_experts"][0])]  # fmt: skip
    print_table(f"layer 0: {r['experts']} experts + {r['redundant']} redundant on {r['gpus']} "
                f"GPUs / {r['nodes']} nodes ({r['policy']})",
                ["gpu", "node", "load before", "load after", "experts (* = replicated)"], rows)  # fmt: skip
    per_layer = zip(*(r[key] for key, _ in BALANCE_SUMMARY))  # (layer's figure of each key)
    print_table("imbalance (max / mean GPU load)", ["layer", *(c for _, c in BALANCE_SUMMARY)],
                [[layer, *figures] for layer, figures in enumerate(per_layer)])  # fmt: skip


TRAIN_ROWS = 30
"""``ep train`` prints this many evenly spaced steps of a longer run (the JSON has all)."""


def print_train_report(report: Any, plot: Path) -> None:
    """``ep train``'s table of a :class:`~nobubble.bench.ep_train.TrainReport` (at most
    :data:`TRAIN_ROWS` evenly spaced steps), its summary lines and the ``plot`` written."""
    c, n = report.config, len(report.losses)
    shown = range(n) if n <= TRAIN_ROWS else sorted(
        {round(i * (n - 1) / (TRAIN_ROWS - 1)) for i in range(TRAIN_ROWS)})  # fmt: skip
    dense = report.dense_losses is not None
    rows = [[s + 1, report.losses[s],
             *([report.dense_losses[s], report.dense_abs_diff[s]] if dense else []),
             report.rank_imbalance[s], report.expert_imbalance[s]] for s in shown]  # fmt: skip
    print_table(
        f"ep train: {c.num_ranks} ranks (dp {report.dp} x ep {report.ep}), {c.num_experts} "
        f"experts + {c.num_redundant} redundant, top-{c.topk}, "
        + (f"rebalance every {c.rebalance_every} steps" if c.rebalance_every else "no rebalancing"),
        ["step", "loss", *(["dense loss", "|diff|"] if dense else []),
         "max/mean rank load", "max/mean expert load"],
        rows,
        caption="load: (token, slot) rows received, max / mean over ranks and over physical "
        "experts, mean over MoE layers",
    )  # fmt: skip
    out = console()
    out.print(
        f"loss {report.losses[0]:.4f} -> {report.final_loss:.4f} in {n} steps "
        f"({report.seconds:.1f} s); max/mean rank load over the second half "
        f"{report.rank_imbalance_second_half:.4f}"
    )
    if dense:
        verdict = "equal" if report.dense_ok else "DIFFERENT"
        out.print(
            f"dense single process: loss {report.dense_losses[-1]:.4f} at the last step; "
            f"|diff| {report.dense_abs_diff[-1]:.2e} last, {max(report.dense_abs_diff):.2e} max "
            f"({verdict} within 1e-4)"
        )
    if report.rebalances:
        moved = sum(r["moved"] for r in report.rebalances)
        out.print(f"{len(report.rebalances)} layer rebalances moved {moved} experts")
    out.print(f"plot: {plot}")
