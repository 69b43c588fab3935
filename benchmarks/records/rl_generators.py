"""``benchmarks/rl_generators.py``: fully-async throughput against the number of generators,
wait-bound and compute-bound (docs/rl/system.md)."""

from __future__ import annotations

from dataclasses import dataclass

from benchmarks._common import Record, Result, load_result
from benchmarks.records import Renderer, count, md_table, pct, prose, times


@dataclass(frozen=True, kw_only=True)
class GeneratorsSetup(Record):
    """The benchmark's flags and the machine's core count."""

    rounds: int
    steps: int
    wait: float
    cpu_count: int


@dataclass(frozen=True, kw_only=True)
class GeneratorsRow(Record):
    """``knob``: ``wait`` (a remote generator) or ``compute`` (a local one); medians over
    the rounds, ``runs``: samples/s per round."""

    knob: str
    generators: int
    samples_per_s: float
    speedup_vs_1: float
    idle_trainer: float
    runs: list[float]


@dataclass(frozen=True, kw_only=True)
class RlGenerators(Result):
    setup: GeneratorsSetup
    rows: list[GeneratorsRow]


FILES = {"rl_generators": RlGenerators}


def generators() -> str:
    """Generator scaling, wait-bound and compute-bound."""
    data = load_result(RlGenerators, "rl_generators")
    setup = data.setup
    table = md_table(
        ["generation", "generators", "samples/s", "vs 1 generator", "trainer idle"],
        [["waits (remote)" if r.knob == "wait" else "computes (local)", r.generators,
          count(r.samples_per_s), times(r.speedup_vs_1), pct(r.idle_trainer, 0)]
         for r in data.rows],
    )  # fmt: skip
    note = (
        f"Fully-async, {setup.steps} steps, medians of {setup.rounds} interleaved rounds "
        f"on {setup.cpu_count} cores. A waiting generator sleeps {setup.wait} s per "
        "call; a computing one samples with a policy of width 128."
    )
    return f"{table}\n\n{prose(note)}"


TABLES: dict[str, Renderer] = {"rl.generators": generators}
