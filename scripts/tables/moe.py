"""Tables of the moe docs (docs/moe/*.md), rendered from benchmarks/results/*.json.

Each renderer returns the table and, where the page quotes figures from it, a short line under
it with those figures, so that no measured number on the page lives outside a generated block.
Published DeepEP figures (not measurements of this repository) are named constants below, with
their source.
"""

from __future__ import annotations

from typing import Any

from scripts.tables import Renderer, f, load, md_table, pct, times

# DeepEP's README (github.com/deepseek-ai/DeepEP, "Performance"): H800 GPUs, NVLink ~160 GB/s,
# CX7 InfiniBand 400 Gb/s RDMA (~50 GB/s). Shown beside the CPU figures for scale only.
DEEPEP_INTRANODE_EP8_GBPS = (153, 158)  # normal kernels, intranode EP8: dispatch, combine NVLink
DEEPEP_INTERNODE_EP32_GBPS = (58, 57)  # normal kernels, internode EP32: dispatch, combine RDMA
DEEPEP_LOW_LATENCY_EP8_US = (77, 114)  # low-latency kernels, EP8, FP8 dispatch: dispatch, combine

# benchmarks/ep_dispatch.py runs, one row each: (label, JSON under benchmarks/results/).
EP_DISPATCH_RUNS = (
    ("`python -m benchmarks.ep_dispatch`", "ep_dispatch.json"),
    ("`python -m benchmarks.ep_dispatch --transport shm`", "ep_dispatch_shm.json"),
)
EP_DISPATCH_METHODS = ("buffer", "per-pair all-to-all", "all-gather")
ELEMENT_SIZE = {"bf16": 2, "fp32": 4}  # bytes per element of the benchmarks' payload dtypes


def _bold(cell: str) -> str:
    return f"**{cell}**"


def _int(value: float) -> str:
    """An integer with thousands separators: ``58,490,880``."""
    return f"{round(value):,}"


def _config(config: dict[str, Any], key: str) -> Any:
    """``config[key]`` of an ``ep_dispatch`` JSON: ``num_ranks`` etc., or the names used before
    the fields were renamed (``ranks``, ``tokens``, ``experts``, ``iters``, ``warmup``)."""
    for name in (f"num_{key}", key):
        if name in config:
            return config[name]
    raise KeyError(f"config has neither num_{key} nor {key}: {sorted(config)}")


# ---------------------------------------------------------------- docs/moe/dispatch.md


def ep_dispatch_runs() -> str:
    """`nobubble ep bench`'s three dispatchers, one row per stored benchmarks.ep_dispatch run."""
    rows, shapes, bytes_lines = [], [], []
    for label, name in EP_DISPATCH_RUNS:
        data = load(name)
        by = {m["method"]: m for m in data["methods"]}
        buf, pair, gather = (by[m] for m in EP_DISPATCH_METHODS)
        if not all(m["correct"] for m in data["methods"]):
            raise ValueError(f"{name}: a method produced wrong results")
        rows.append(
            [
                label,
                " / ".join(f(by[m]["dispatch_ms"] / 1e3, 2) for m in EP_DISPATCH_METHODS),
                " / ".join(f(by[m]["combine_ms"] / 1e3, 2) for m in EP_DISPATCH_METHODS),
                f"{times(pair['dispatch_ms'] / buf['dispatch_ms'])}, "
                f"{times(pair['combine_ms'] / buf['combine_ms'])}",
                f"{times(gather['dispatch_ms'] / buf['dispatch_ms'])}, "
                f"{times(gather['combine_ms'] / buf['combine_ms'])}",
            ]
        )
        c = data["config"]
        ranks, tokens = _config(c, "ranks"), _config(c, "tokens")
        shapes.append(
            f"{ranks} ranks x {tokens} x {c['hidden']} {c['dtype']} "
            f"tokens per rank, top-{c['topk']} of {_config(c, 'experts')} experts, median of "
            f"{_config(c, 'iters')} iterations"
        )
        mb, sent = 1e6, buf["dispatch_payload_bytes"]
        row_bytes = c["hidden"] * ELEMENT_SIZE[c["dtype"]]
        reach = data["logical_bytes"] / row_bytes / (ranks * tokens)  # mean sum(is_token_in_rank)
        bytes_lines.append(
            f"Bytes one dispatch moves, all ranks: Buffer {f(sent / mb)} MB (equal to the logical "
            f"bytes: {sent == data['logical_bytes']}), per-pair all-to-all "
            f"{f(pair['dispatch_payload_bytes'] / mb)} MB "
            f"({times(pair['dispatch_payload_bytes'] / sent)}), all-gather "
            f"{f(gather['dispatch_payload_bytes'] / mb)} MB "
            f"({times(gather['dispatch_payload_bytes'] / sent)}); a token reaches "
            f"{f(reach, 2)} of {ranks} ranks on average; results exact."
        )
    shape = "; ".join(dict.fromkeys(shapes))
    same_bytes = " ".join(dict.fromkeys(bytes_lines))
    table = md_table(
        ["run", "dispatch s", "combine s", "per-pair / buffer", "all-gather / buffer"],
        rows,
        align="lllll",
    )
    return f"{table}\n\nEvery run: {shape}. {same_bytes}"


# ---------------------------------------------------------------- docs/moe/fastpath.md

TRANSPORT_ROWS = (
    ("gloo", "Buffer over gloo all-to-all (baseline)"),
    ("shm-unfused", "Buffer over ShmTransport"),
    ("shm-fused-torch", "Buffer over shm, torch reduce, fresh outputs"),
    ("shm", "Buffer over shm (fused copies, C combine kernel, recycled outputs)"),
)


def transports() -> str:
    """Intranode dispatch + combine per path (`transports` in ep_transports.json)."""
    data = load("ep_transports.json")["transports"]
    rows = []
    for key, label in TRANSPORT_ROWS:
        r = data["rows"][key]
        cells = [
            label,
            f(r["dispatch_ms"]),
            f(r["combine_ms"]),
            f(r["dispatch_gbps_per_rank"], 2),
            f(r["combine_gbps_per_rank"], 2),
            f(r["aggregate_gbps"], 2),
            f(r["fraction_of_memcpy"], 2),
        ]
        rows.append([_bold(c) for c in cells] if key == "shm" else cells)
    d, c = DEEPEP_INTRANODE_EP8_GBPS
    rows.append(["DeepEP intranode EP8, H800 NVLink (published)", "", "", d, c, "", ""])
    table = md_table(
        [
            "path",
            "dispatch ms",
            "combine ms",
            "dispatch GB/s per rank",
            "combine GB/s per rank",
            "all ranks, both directions GB/s",
            "fraction of 1-core memcpy",
        ],
        rows,
    )
    gloo, shm = data["rows"]["gloo"], data["rows"]["shm"]
    return (
        f"{table}\n\nSingle-core memcpy in the same run: "
        f"{f(data['memcpy_gbps_single_core'], 2)} GB/s; results bit-equal across all paths: "
        f"{data['bit_equal']}. Shared memory vs gloo, dispatch + combine: "
        f"**{times(data['speedup_shm_over_gloo'], 1)}** "
        f"({f(gloo['dispatch_plus_combine_ms'], 0)} ms -> "
        f"{f(shm['dispatch_plus_combine_ms'], 0)} ms)."
    )


def hierarchical() -> str:
    """Flat vs hierarchical bytes across nodes (`hierarchical` in ep_transports.json)."""
    data = load("ep_transports.json")["hierarchical"]
    s, rows = data["shape"], data["rows"]
    table = md_table(
        [
            "mode",
            "bytes crossing node boundaries (dispatch, all ranks)",
            "dispatch ms",
            "combine ms",
        ],
        [
            [
                "flat (one copy per destination rank)",
                _int(data["inter_node_bytes_flat"]),
                f(rows["flat"]["dispatch_ms"], 0),
                f(rows["flat"]["combine_ms"], 0),
            ],
            [
                "hierarchical (one copy per destination node)",
                _int(data["inter_node_bytes_hierarchical"]),
                f(rows["hierarchical"]["dispatch_ms"], 0),
                f(rows["hierarchical"]["combine_ms"], 0),
            ],
            [
                "DeepEP internode EP32, H800 RDMA (published)",
                "{} GB/s dispatch, {} GB/s combine".format(*DEEPEP_INTERNODE_EP32_GBPS),
                "",
                "",
            ],
        ],
    )
    element_size = ELEMENT_SIZE[s["dtype"]]
    return (
        f"{table}\n\nDistinct (token, other node) pairs = {_int(data['distinct_token_node_pairs'])}"
        f"; x {s['hidden']} x {element_size} bytes = "
        f"{_int(data['distinct_token_node_pairs'] * s['hidden'] * element_size)} = the counted "
        f"bytes: {data['formula_holds']}; dispatch bit-equal to flat: {data['bit_equal_dispatch']}."
        f" Hierarchical / flat bytes = "
        f"**{f(data['inter_node_bytes_hierarchical'] / data['inter_node_bytes_flat'], 3)}**."
    )


LOW_LATENCY_ROWS = (
    ("low-latency shm bf16", "low-latency shm bf16"),
    ("low-latency shm fp8", "low-latency shm fp8"),
    ("low-latency dist bf16", "low-latency dist bf16"),
    ("low-latency dist fp8", "low-latency dist fp8"),
    ("normal gloo", "normal gloo"),
    ("normal shm", "normal shm (Buffer over shm)"),
)


def low_latency() -> str:
    """Low-latency vs normal mode at 128 tokens (`low_latency` in ep_transports.json)."""
    data = load("ep_transports.json")["low_latency"]
    rows = [
        [
            label,
            _int(data["rows"][key]["dispatch_us"]),
            _int(data["rows"][key]["combine_us"]),
            _int(data["rows"][key]["dispatch_bytes_all_ranks"]),
        ]
        for key, label in LOW_LATENCY_ROWS
    ]
    d, c = DEEPEP_LOW_LATENCY_EP8_US
    rows.append(["DeepEP low-latency EP8, H800, FP8 dispatch (published)", d, c, ""])
    table = md_table(
        ["mode", "dispatch us", "combine us", "dispatch bytes leaving ranks (all ranks)"], rows
    )
    b = {key: r["dispatch_bytes_all_ranks"] for key, r in data["rows"].items()}
    return (
        f"{table}\n\nFP8 / bf16 dispatch bytes: **{f(data['fp8_over_bf16_bytes'], 3)}**; "
        f"low-latency / normal (deduplicated) bytes, bf16: "
        f"{times(b['low-latency shm bf16'] / b['normal shm'])}; fixed-size slots over "
        f"torch.distributed / shared memory: "
        f"{times(b['low-latency dist bf16'] / b['low-latency shm bf16'])}."
    )


OVERLAP_MODES = ("no overlap", "chunked sequential", "chunked overlap")


def overlap() -> str:
    """One MoE layer step without and with chunked overlap (`overlap` in ep_transports.json)."""
    data = load("ep_transports.json")["overlap"]["rows"]
    rows = [
        [
            transport,
            mode,
            f(r["step_ms"]),
            f(r["comm_ms"]),
            f(r["experts_ms"]),
            pct(r["communication_hidden"], 0),
            times(r["speedup_vs_no_overlap"]),
        ]
        for transport in ("gloo", "shm")
        for mode in OVERLAP_MODES
        for r in [data[transport][mode]]
    ]
    table = md_table(
        [
            "transport",
            "mode",
            "step ms",
            "communication ms",
            "experts ms",
            "communication hidden",
            "step speedup",
        ],
        rows,
        align="llrrrrr",
    )
    gloo, shm = data["gloo"]["chunked overlap"], data["shm"]["chunked overlap"]
    hidden = sorted(r["communication_hidden"] for r in (gloo, shm))
    slower = sorted(
        data[t]["chunked overlap"]["comm_ms"] / data[t]["no overlap"]["comm_ms"]
        for t in ("gloo", "shm")
    )
    return (
        f"{table}\n\nChunked overlap hid {pct(hidden[0], 0)}-{pct(hidden[1], 0)} of the "
        f"communication; communication took {times(slower[0], 1)}-{times(slower[1], 1)} as long "
        f"as without overlap; step speedup {times(gloo['speedup_vs_no_overlap'])} with gloo, "
        f"{times(shm['speedup_vs_no_overlap'])} with shared memory, where communication takes "
        f"only {f(data['shm']['no overlap']['comm_ms'], 0)} ms without overlap."
    )


def microbatch_overlap() -> str:
    """A dense + MoE stage over 2 microbatches, sequential vs overlapped (ep_microbatch_overlap)."""
    data = load("ep_microbatch_overlap.json")
    rows = data["rows"]
    if not all(r["bit_equal"] for r in rows):
        raise ValueError("ep_microbatch_overlap.json: overlapped outputs differ from sequential")
    table = md_table(
        [
            "layout",
            "tokens x hidden",
            "sequential ms",
            "overlapped ms",
            "sequential / overlapped",
            "same, per repeat",
            "communication ms, seq -> overlapped",
            "compute ms, seq -> overlapped",
            "communication hidden",
        ],
        [
            [
                f"{r['layout']} ({r['ranks']} ranks)",
                f"{r['tokens_per_microbatch']} x {r['hidden']}",
                f(r["sequential_step_ms"]),
                f(r["overlapped_step_ms"]),
                _bold(times(r["speedup"])),
                times(r["speedup_paired"]),
                f"{f(r['sequential_comm_ms'])} -> {f(r['overlapped_comm_ms'])}",
                f"{f(r['sequential_compute_ms'])} -> {f(r['overlapped_compute_ms'])}",
                pct(r["communication_hidden"], 0),
            ]
            for r in rows
        ],
        align="llrrrrrrr",
    )
    per_layout = []
    for layout in dict.fromkeys(r["layout"] for r in rows):
        mine = [r for r in rows if r["layout"] == layout]
        share = sorted(r["sequential_comm_ms"] / r["sequential_step_ms"] for r in mine)
        speed = sorted(r["speedup"] for r in mine)
        slower = sorted(r["overlapped_compute_ms"] / r["sequential_compute_ms"] for r in mine)
        per_layout.append(
            f"{layout}: communication is {pct(share[0], 0)}-{pct(share[-1], 0)} of the "
            f"sequential step, compute takes {times(slower[0])}-{times(slower[-1])} as long when "
            f"overlapped, step ratio {times(speed[0])}-{times(speed[-1])}"
        )
    c, load_1m = data["config"], data["load_average"][0]
    return (
        f"{table}\n\n{data['cpu_count']} cores, {c['threads_per_rank']} torch thread per rank "
        f"plus its communication thread; medians of {c['repeats']} alternating repeats, slowest "
        f"rank (per repeat: the median of each repeat's sequential / overlapped); load average "
        f"{f(data['load_average_before'][0], 1)} before, {f(load_1m, 1)} at the end; overlapped "
        f"outputs bit-equal to sequential: True. " + "; ".join(per_layout) + "."
    )


# ---------------------------------------------------------------- docs/moe/balance.md


def _skew(name: str) -> str:
    """``zipf:1`` -> ``Zipf 1.0``, ``pareto:1.5`` -> ``Pareto 1.5``."""
    kind, _, param = name.partition(":")
    return f"{kind.capitalize()} {float(param):.1f}"


def eplb_balance() -> str:
    """Max / mean GPU load, EPLB vs nobubble (`balance` in eplb_balance.json)."""
    data = load("eplb_balance.json")["balance"]
    rows = [
        [
            _skew(r["skew"]),
            f(r["imbalance_none"], 3),
            f"{f(r['imbalance_eplb'], 3)} ({f(r['worst_layer_eplb'], 3)})",
            _bold(f"{f(r['imbalance_ours'], 3)} ({f(r['worst_layer_ours'], 3)})"),
            f(r["dup_gpus_per_layer_eplb"]),
            f"{r['dup_gpus_per_layer_ours']:g}",
        ]
        for r in data
    ]
    table = md_table(
        [
            "loads",
            "no redundancy",
            "EPLB (original)",
            "nobubble",
            "EPLB: GPUs with an expert twice, per layer",
            "nobubble",
        ],
        rows,
        align="llllll",
    )
    ours = [r["ms_per_layer_ours"] for r in data]
    ref = [r["ms_per_layer_eplb"] for r in data]
    return (
        f"{table}\n\nPlacement time per layer, median: {f(min(ours), 0)}-{f(max(ours), 0)} ms "
        f"(nobubble, pure Python) vs {f(min(ref), 0)}-{f(max(ref), 0)} ms (the reference, torch "
        f"ops in Python loops)."
    )


def eplb_incremental() -> str:
    """Stale / fresh / incremental placement after one drift (`incremental_once`)."""
    data = load("eplb_balance.json")
    physical = data["config"]["experts"] + data["config"]["redundant"]
    rows = [
        [
            f"{r['drift_sigma']:g}",
            f(r["imbalance_stale"], 3),
            f(r["imbalance_fresh"], 3),
            f(r["imbalance_incremental"], 3),
            f(r["moved_fresh"]),
            _bold(f(r["moved_incremental"])),
        ]
        for r in data["incremental_once"]
    ]
    return md_table(
        [
            "drift sigma",
            "stale placement",
            "fresh",
            "incremental",
            f"moved, fresh (of {physical})",
            "moved, incremental",
        ],
        rows,
        align="llllll",
    )


def eplb_periodic() -> str:
    """Periodic rebalances (`periodic`) and online rebalancing on gloo ranks (`online`)."""
    data = load("eplb_balance.json")
    per = data["periodic"]

    def mean(xs: list[float]) -> float:
        return sum(xs) / len(xs)

    periodic = md_table(
        ["rebalance", "experts moved per layer, mean", "max / mean GPU load, mean"],
        [
            [mode, f(mean(per[f"moved_{key}"])), f(mean(per[f"imb_{key}"]), 3)]
            for mode, key in (("fresh", "fresh"), ("incremental", "incremental"))
        ],
    )
    online = md_table(
        [
            "online rebalance",
            "experts moved",
            "MiB sent",
            "ms, median",
            "max / mean, stale placement",
            "max / mean after",
        ],
        [
            [
                r["mode"],
                f"{r['moved_per_rebalance']:g}",
                f(r["mb_sent_per_rebalance"]),
                f(r["ms_median"], 0),
                f(r["imbalance_stale"], 3),
                f(r["imbalance_after"], 3),
            ]
            for r in data["online"]["results"]
        ],
    )
    n = len(per["moved_fresh"])
    c = data["online"]["config"]
    return (
        f"{n} periodic rebalances:\n\n{periodic}\n\nOnline, on {c['ranks']} gloo ranks "
        f"({c['experts']} experts -> {c['physical']} physical, H={c['hidden']}, "
        f"I={c['expert_hidden']}, weights + Adam state), per rebalance:\n\n{online}"
    )


TABLES: dict[str, Renderer] = {
    "moe.ep_dispatch": ep_dispatch_runs,
    "moe.transports": transports,
    "moe.hierarchical": hierarchical,
    "moe.low_latency": low_latency,
    "moe.overlap": overlap,
    "moe.microbatch_overlap": microbatch_overlap,
    "moe.eplb_balance": eplb_balance,
    "moe.eplb_incremental": eplb_incremental,
    "moe.eplb_periodic": eplb_periodic,
}
