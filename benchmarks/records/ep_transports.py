"""``benchmarks/ep_transports.py``: the intranode transports, flat against hierarchical bytes
across nodes, low-latency mode and chunked overlap (docs/moe/fastpath.md, and the README's
headline). A run of some sections keeps the others' figures, so each section may be absent."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeVar

from benchmarks._common import Record, Result, load_result, optional
from benchmarks.records import Renderer, count, f, md_table, pct, times

# DeepEP's README (github.com/deepseek-ai/DeepEP, "Performance"): H800 GPUs, NVLink ~160 GB/s,
# CX7 InfiniBand 400 Gb/s RDMA (~50 GB/s). Shown beside the CPU figures for scale only.
DEEPEP_INTRANODE_EP8_GBPS = (153, 158)  # normal kernels, intranode EP8: dispatch, combine NVLink
DEEPEP_INTERNODE_EP32_GBPS = (58, 57)  # normal kernels, internode EP32: dispatch, combine RDMA
DEEPEP_LOW_LATENCY_EP8_US = (77, 114)  # low-latency kernels, EP8, FP8 dispatch: dispatch, combine
ELEMENT_SIZE = {"bf16": 2, "fp32": 4}  # bytes per element of the benchmarks' payload dtypes


@dataclass(frozen=True, kw_only=True)
class Shape(Record):
    """The token batch of the transports section."""

    ranks: int
    tokens: int
    hidden: int
    experts: int
    topk: int
    dtype: str


@dataclass(frozen=True, kw_only=True)
class NodeShape(Record):
    """The token batch of the hierarchical section, over ``nodes`` nodes."""

    nodes: int
    ranks_per_node: int
    ranks: int
    tokens: int
    hidden: int
    experts: int
    topk: int
    dtype: str


@dataclass(frozen=True, kw_only=True)
class LowLatencyShape(Record):
    ranks: int
    hidden: int
    experts: int
    topk: int
    dtype: str
    tokens_per_rank: int


@dataclass(frozen=True, kw_only=True)
class OverlapShape(Record):
    ranks: int
    tokens_per_rank: int
    hidden: int
    expert_hidden: int
    experts: int
    topk: int
    chunks: int
    dtype: str


@dataclass(frozen=True, kw_only=True)
class TransportRow(Record):
    dispatch_ms: float
    combine_ms: float
    dispatch_plus_combine_ms: float
    bytes_per_direction: int
    dispatch_gbps_per_rank: float
    combine_gbps_per_rank: float
    aggregate_gbps: float
    fraction_of_memcpy: float


@dataclass(frozen=True, kw_only=True)
class Transports(Record):
    shape: Shape
    memcpy_gbps_single_core: float
    rows: dict[str, TransportRow]
    speedup_shm_over_gloo: float
    bit_equal: bool


@dataclass(frozen=True, kw_only=True)
class Timing(Record):
    dispatch_ms: float
    combine_ms: float


@dataclass(frozen=True, kw_only=True)
class Hierarchical(Record):
    shape: NodeShape
    inter_node_bytes_hierarchical: int
    inter_node_bytes_flat: int
    distinct_token_node_pairs: int
    formula_holds: bool
    bit_equal_dispatch: bool
    rows: dict[str, Timing]


@dataclass(frozen=True, kw_only=True)
class LowLatencyRow(Record):
    dispatch_us: float
    combine_us: float
    dispatch_bytes_all_ranks: int


@dataclass(frozen=True, kw_only=True)
class LowLatency(Record):
    shape: LowLatencyShape
    rows: dict[str, LowLatencyRow]
    fp8_over_bf16_bytes: float


@dataclass(frozen=True, kw_only=True)
class OverlapRow(Record):
    step_ms: float
    comm_ms: float
    experts_ms: float
    communication_hidden: float
    speedup_vs_no_overlap: float


@dataclass(frozen=True, kw_only=True)
class Overlap(Record):
    """transport -> mode (``no overlap``, ``chunked sequential``, ``chunked overlap``)."""

    shape: OverlapShape
    rows: dict[str, dict[str, OverlapRow]]


@dataclass(frozen=True, kw_only=True)
class EpTransports(Result):
    quick: bool
    transports: Transports | None = optional()
    load_average: list[float]
    hierarchical: Hierarchical | None = optional()
    low_latency: LowLatency | None = optional()
    overlap: Overlap | None = optional()


FILES = {"ep_transports": EpTransports, "ep_transports_quick": EpTransports}


T = TypeVar("T")


def _section(value: T | None, name: str) -> T:
    """A section of ``ep_transports.json``, or ValueError naming the one missing."""
    if value is None:
        raise ValueError(f"ep_transports.json lacks {name}: run benchmarks.ep_transports")
    return value


def _bold(cell: str) -> str:
    return f"**{cell}**"


TRANSPORT_ROWS = (
    ("gloo", "Buffer over gloo all-to-all (baseline)"),
    ("shm-unfused", "Buffer over ShmTransport"),
    ("shm-fused-torch", "Buffer over shm, torch reduce, fresh outputs"),
    ("shm", "Buffer over shm (fused copies, C combine kernel, recycled outputs)"),
)


def transports() -> str:
    """Intranode dispatch + combine per path."""
    data = _section(load_result(EpTransports, "ep_transports").transports, "transports")
    rows: list[list[object]] = []
    for key, label in TRANSPORT_ROWS:
        r = data.rows[key]
        cells: list[object] = [label, f(r.dispatch_ms), f(r.combine_ms), f(r.dispatch_gbps_per_rank, 2),
                 f(r.combine_gbps_per_rank, 2), f(r.aggregate_gbps, 2),
                 f(r.fraction_of_memcpy, 2)]  # fmt: skip
        rows.append([_bold(str(c)) for c in cells] if key == "shm" else cells)
    d, c = DEEPEP_INTRANODE_EP8_GBPS
    rows.append(["DeepEP intranode EP8, H800 NVLink (published)", "", "", d, c, "", ""])
    table = md_table(
        ["path", "dispatch ms", "combine ms", "dispatch GB/s per rank", "combine GB/s per rank",
         "all ranks, both directions GB/s", "fraction of 1-core memcpy"],
        rows,
    )  # fmt: skip
    gloo, shm = data.rows["gloo"], data.rows["shm"]
    return (
        f"{table}\n\nSingle-core memcpy in the same run: "
        f"{f(data.memcpy_gbps_single_core, 2)} GB/s; results bit-equal across all paths: "
        f"{data.bit_equal}. Shared memory vs gloo, dispatch + combine: "
        f"**{times(data.speedup_shm_over_gloo, 1)}** "
        f"({f(gloo.dispatch_plus_combine_ms, 0)} ms -> "
        f"{f(shm.dispatch_plus_combine_ms, 0)} ms)."
    )


def hierarchical() -> str:
    """Flat vs hierarchical bytes across nodes."""
    data = _section(load_result(EpTransports, "ep_transports").hierarchical, "hierarchical")
    s, rows = data.shape, data.rows
    table = md_table(
        ["mode", "bytes crossing node boundaries (dispatch, all ranks)", "dispatch ms",
         "combine ms"],
        [
            ["flat (one copy per destination rank)", count(data.inter_node_bytes_flat),
             f(rows["flat"].dispatch_ms, 0), f(rows["flat"].combine_ms, 0)],
            ["hierarchical (one copy per destination node)",
             count(data.inter_node_bytes_hierarchical), f(rows["hierarchical"].dispatch_ms, 0),
             f(rows["hierarchical"].combine_ms, 0)],
            ["DeepEP internode EP32, H800 RDMA (published)",
             "{} GB/s dispatch, {} GB/s combine".format(*DEEPEP_INTERNODE_EP32_GBPS), "", ""],
        ],
    )  # fmt: skip
    element_size = ELEMENT_SIZE[s.dtype]
    pairs = data.distinct_token_node_pairs
    return (
        f"{table}\n\nDistinct (token, other node) pairs = {count(pairs)}"
        f"; x {s.hidden} x {element_size} bytes = {count(pairs * s.hidden * element_size)} = "
        f"the counted bytes: {data.formula_holds}; dispatch bit-equal to flat: "
        f"{data.bit_equal_dispatch}. Hierarchical / flat bytes = "
        f"**{f(data.inter_node_bytes_hierarchical / data.inter_node_bytes_flat, 3)}**."
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
    """Low-latency vs normal mode at 128 tokens."""
    data = _section(load_result(EpTransports, "ep_transports").low_latency, "low_latency")
    rows: list[list[object]] = [
        [label, count(data.rows[key].dispatch_us), count(data.rows[key].combine_us),
         count(data.rows[key].dispatch_bytes_all_ranks)]
        for key, label in LOW_LATENCY_ROWS
    ]  # fmt: skip
    d, c = DEEPEP_LOW_LATENCY_EP8_US
    rows.append(["DeepEP low-latency EP8, H800, FP8 dispatch (published)", d, c, ""])
    table = md_table(
        ["mode", "dispatch us", "combine us", "dispatch bytes leaving ranks (all ranks)"], rows
    )
    b = {key: r.dispatch_bytes_all_ranks for key, r in data.rows.items()}
    return (
        f"{table}\n\nFP8 / bf16 dispatch bytes: **{f(data.fp8_over_bf16_bytes, 3)}**; "
        f"low-latency / normal (deduplicated) bytes, bf16: "
        f"{times(b['low-latency shm bf16'] / b['normal shm'])}; fixed-size slots over "
        f"torch.distributed / shared memory: "
        f"{times(b['low-latency dist bf16'] / b['low-latency shm bf16'])}."
    )


OVERLAP_MODES = ("no overlap", "chunked sequential", "chunked overlap")


def overlap() -> str:
    """One MoE layer step without and with chunked overlap."""
    section = _section(load_result(EpTransports, "ep_transports").overlap, "overlap")
    data = section.rows
    rows = [
        [transport, mode, f(r.step_ms), f(r.comm_ms), f(r.experts_ms),
         pct(r.communication_hidden, 0), times(r.speedup_vs_no_overlap)]
        for transport in ("gloo", "shm")
        for mode in OVERLAP_MODES
        for r in [data[transport][mode]]
    ]  # fmt: skip
    table = md_table(
        ["transport", "mode", "step ms", "communication ms", "experts ms",
         "communication hidden", "step speedup"],
        rows,
        align="llrrrrr",
    )  # fmt: skip
    gloo, shm = data["gloo"]["chunked overlap"], data["shm"]["chunked overlap"]
    hidden = sorted(r.communication_hidden for r in (gloo, shm))
    slower = sorted(
        data[t]["chunked overlap"].comm_ms / data[t]["no overlap"].comm_ms for t in ("gloo", "shm")
    )
    return (
        f"{table}\n\nChunked overlap hid {pct(hidden[0], 0)}-{pct(hidden[1], 0)} of the "
        f"communication; communication took {times(slower[0], 1)}-{times(slower[1], 1)} as long "
        f"as without overlap; step speedup {times(gloo.speedup_vs_no_overlap)} with gloo, "
        f"{times(shm.speedup_vs_no_overlap)} with shared memory, where communication takes "
        f"only {f(data['shm']['no overlap'].comm_ms, 0)} ms without overlap."
    )


TABLES: dict[str, Renderer] = {
    "moe.transports": transports,
    "moe.hierarchical": hierarchical,
    "moe.low_latency": low_latency,
    "moe.overlap": overlap,
}
