"""``benchmarks/ep_microbatch_overlap.py``: a dense + MoE stage over two microbatches,
sequential against overlapped (docs/moe/fastpath.md)."""

from __future__ import annotations

from dataclasses import dataclass

from benchmarks._common import Record, Result, load_result
from benchmarks.records import Renderer, f, md_table, pct, times


@dataclass(frozen=True, kw_only=True)
class OverlapConfig(Record):
    num_microbatches: int
    num_experts: int
    topk: int
    expert_hidden: str
    num_shared_experts: int
    dense_part: str
    dtype: str
    transport: str
    repeats: int
    threads_per_rank: int


@dataclass(frozen=True, kw_only=True)
class MicrobatchRow(Record):
    """One layout and size: medians (ms) of the slowest rank."""

    layout: str
    ranks: int
    tokens_per_microbatch: int
    hidden: int
    sequential_step_ms: float
    overlapped_step_ms: float
    speedup: float
    speedup_paired: float
    sequential_comm_ms: float
    overlapped_comm_ms: float
    sequential_compute_ms: float
    overlapped_compute_ms: float
    communication_hidden: float
    bit_equal: bool


@dataclass(frozen=True, kw_only=True)
class EpMicrobatchOverlap(Result):
    config: OverlapConfig
    cpu_count: int
    load_average_before: list[float]
    load_average: list[float]
    rows: list[MicrobatchRow]


FILES = {"ep_microbatch_overlap": EpMicrobatchOverlap}


def _layout_note(layout: str, mine: list[MicrobatchRow]) -> str:
    share = sorted(r.sequential_comm_ms / r.sequential_step_ms for r in mine)
    speed = sorted(r.speedup for r in mine)
    slower = sorted(r.overlapped_compute_ms / r.sequential_compute_ms for r in mine)
    return (
        f"{layout}: communication is {pct(share[0], 0)}-{pct(share[-1], 0)} of the "
        f"sequential step, compute takes {times(slower[0])}-{times(slower[-1])} as long when "
        f"overlapped, step ratio {times(speed[0])}-{times(speed[-1])}"
    )


def microbatch_overlap() -> str:
    """A dense + MoE stage over 2 microbatches, sequential vs overlapped."""
    data = load_result(EpMicrobatchOverlap, "ep_microbatch_overlap")
    rows = data.rows
    if not all(r.bit_equal for r in rows):
        raise ValueError("ep_microbatch_overlap.json: overlapped outputs differ from sequential")
    table = md_table(
        ["layout", "tokens x hidden", "sequential ms", "overlapped ms", "sequential / overlapped",
         "same, per repeat", "communication ms, seq -> overlapped",
         "compute ms, seq -> overlapped", "communication hidden"],
        [
            [f"{r.layout} ({r.ranks} ranks)", f"{r.tokens_per_microbatch} x {r.hidden}",
             f(r.sequential_step_ms), f(r.overlapped_step_ms), f"**{times(r.speedup)}**",
             times(r.speedup_paired), f"{f(r.sequential_comm_ms)} -> {f(r.overlapped_comm_ms)}",
             f"{f(r.sequential_compute_ms)} -> {f(r.overlapped_compute_ms)}",
             pct(r.communication_hidden, 0)]
            for r in rows
        ],
        align="llrrrrrrr",
    )  # fmt: skip
    per_layout = [_layout_note(layout, [r for r in rows if r.layout == layout])
                  for layout in dict.fromkeys(r.layout for r in rows)]  # fmt: skip
    c = data.config
    return (
        f"{table}\n\n{data.cpu_count} cores, {c.threads_per_rank} torch thread per rank "
        f"plus its communication thread; medians of {c.repeats} alternating repeats, slowest "
        f"rank (per repeat: the median of each repeat's sequential / overlapped); load average "
        f"{f(data.load_average_before[0], 1)} before, {f(data.load_average[0], 1)} at the end; "
        f"overlapped outputs bit-equal to sequential: True. " + "; ".join(per_layout) + "."
    )


TABLES: dict[str, Renderer] = {"moe.microbatch_overlap": microbatch_overlap}
