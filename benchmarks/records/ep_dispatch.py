"""``benchmarks/ep_dispatch.py``: ``nobubble ep bench``'s three dispatchers (the Buffer, a
per-pair all-to-all, an all-gather), one row per stored run (docs/moe/dispatch.md)."""

from __future__ import annotations

from dataclasses import dataclass

from benchmarks._common import Record, Result, json_key, load_result, optional
from benchmarks.records import Renderer, f, md_table, times
from nobubble.bench.ep_config import MethodResult


@dataclass(frozen=True, kw_only=True)
class DispatchConfig(Record):
    """``BenchConfig`` as ``nobubble.bench.ep_dispatch`` writes it."""

    num_ranks: int
    num_tokens: int
    hidden: int
    num_experts: int
    topk: int
    dtype: str
    num_iters: int
    num_warmup: int
    timeout_s: float
    seed: int
    transport: str | None = optional()


@dataclass(frozen=True, kw_only=True)
class LegacyDispatchConfig(DispatchConfig):
    """The same, in files written before the fields took the ``num_`` prefix."""

    num_ranks: int = json_key("ranks")
    num_tokens: int = json_key("tokens")
    num_experts: int = json_key("experts")
    num_iters: int = json_key("iters")
    num_warmup: int = json_key("warmup")


DispatchMethod = MethodResult  # the row ep bench writes: the library's own result


@dataclass(frozen=True, kw_only=True)
class EpDispatch(Result):
    config: DispatchConfig | LegacyDispatchConfig
    logical_bytes: int
    transport: str | None = optional()
    methods: list[DispatchMethod]
    quick: bool


FILES = {"ep_dispatch": EpDispatch, "ep_dispatch_shm": EpDispatch}

# benchmarks/ep_dispatch.py runs, one row each: (label, file under benchmarks/results/).
RUNS = (
    ("`python -m benchmarks.ep_dispatch`", "ep_dispatch"),
    ("`python -m benchmarks.ep_dispatch --transport shm`", "ep_dispatch_shm"),
)
METHODS = ("buffer", "per-pair all-to-all", "all-gather")
ELEMENT_SIZE = {"bf16": 2, "fp32": 4}  # bytes per element of the benchmarks' payload dtypes


def _bytes_line(data: EpDispatch, by: dict[str, DispatchMethod]) -> str:
    c, mb = data.config, 1e6
    buf, pair, gather = (by[m] for m in METHODS)
    sent = buf.dispatch_payload_bytes
    row_bytes = c.hidden * ELEMENT_SIZE[c.dtype]
    reach = data.logical_bytes / row_bytes / (c.num_ranks * c.num_tokens)  # mean reach
    return (
        f"Bytes one dispatch moves, all ranks: Buffer {f(sent / mb)} MB (equal to the logical "
        f"bytes: {sent == data.logical_bytes}), per-pair all-to-all "
        f"{f(pair.dispatch_payload_bytes / mb)} MB ({times(pair.dispatch_payload_bytes / sent)})"
        f", all-gather {f(gather.dispatch_payload_bytes / mb)} MB "
        f"({times(gather.dispatch_payload_bytes / sent)}); a token reaches "
        f"{f(reach, 2)} of {c.num_ranks} ranks on average; results exact."
    )


def ep_dispatch_runs() -> str:
    """The three dispatchers, one row per stored run, with the bytes each moves."""
    rows, shapes, bytes_lines = [], [], []
    for label, name in RUNS:
        data = load_result(EpDispatch, name)
        by = {m.method: m for m in data.methods}
        buf, pair, gather = (by[m] for m in METHODS)
        if not all(m.correct for m in data.methods):
            raise ValueError(f"{name}: a method produced wrong results")
        rows.append([
            label,
            " / ".join(f(by[m].dispatch_ms / 1e3, 2) for m in METHODS),
            " / ".join(f(by[m].combine_ms / 1e3, 2) for m in METHODS),
            f"{times(pair.dispatch_ms / buf.dispatch_ms)}, "
            f"{times(pair.combine_ms / buf.combine_ms)}",
            f"{times(gather.dispatch_ms / buf.dispatch_ms)}, "
            f"{times(gather.combine_ms / buf.combine_ms)}",
        ])  # fmt: skip
        c = data.config
        shapes.append(
            f"{c.num_ranks} ranks x {c.num_tokens} x {c.hidden} {c.dtype} tokens per rank, "
            f"top-{c.topk} of {c.num_experts} experts, median of {c.num_iters} iterations"
        )
        bytes_lines.append(_bytes_line(data, by))
    table = md_table(
        ["run", "dispatch s", "combine s", "per-pair / buffer", "all-gather / buffer"],
        rows,
        align="lllll",
    )
    shape, same_bytes = "; ".join(dict.fromkeys(shapes)), " ".join(dict.fromkeys(bytes_lines))
    return f"{table}\n\nEvery run: {shape}. {same_bytes}"


TABLES: dict[str, Renderer] = {"moe.ep_dispatch": ep_dispatch_runs}
