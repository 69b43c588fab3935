"""``benchmarks/pp_handshake_runtime.py``: the handshake dispatch on the real runtime against
the static order. Its figures feed no docs table (the page quotes the simulator's)."""

from __future__ import annotations

from dataclasses import dataclass

from benchmarks._common import Record, Result
from benchmarks.records import Renderer


@dataclass(frozen=True, kw_only=True)
class RuntimeModel(Record):
    vocab_size: int
    seq_len: int
    hidden: int
    num_heads: int
    num_layers: int
    seed: int
    name: str


@dataclass(frozen=True, kw_only=True)
class DispatchMeasure(Record):
    """One dispatch policy on the runtime (ms); ``op_ms``: median per op and stage (``F0``)."""

    measured_makespan_ms: float
    measured_step_time_ms: float
    simulated_makespan_ms: float
    replay_makespan_ms: float
    measured_vs_simulated: float
    simulated_bubble_rate: float
    deviations_simulated: int
    op_ms: dict[str, float]


@dataclass(frozen=True, kw_only=True)
class HandshakeRuntimeRun(Record):
    num_ranks: int
    plan: str
    straggler: str
    static: DispatchMeasure
    handshake: DispatchMeasure
    paired_handshake_over_static: float
    ratio_of_medians: float


@dataclass(frozen=True, kw_only=True)
class PpHandshakeRuntime(Result):
    model: RuntimeModel
    t_comm_ms: float
    microbatches: int
    rounds: int
    steps_per_turn: int
    runs: list[HandshakeRuntimeRun]


FILES = {"pp_handshake_runtime": PpHandshakeRuntime}
TABLES: dict[str, Renderer] = {}
