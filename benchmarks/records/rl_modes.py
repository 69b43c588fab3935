"""``benchmarks/rl_modes.py``: synchronous, one-step-off and fully-async training, learning
runs and throughput rounds (docs/rl/system.md, and the README's headline)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from benchmarks._common import Record, Result, json_key, load_result
from benchmarks.records import Renderer, f, md_table, pct, prose, times


@dataclass(frozen=True, kw_only=True)
class ModesRow(Record):
    """One learning run (``run``: mode and seed); idle ratios of generation and training."""

    run: str
    steps: int
    wall_s: float
    samples_per_s: float
    speedup: float
    acc_start: float
    acc_final: float
    t_to_0_9_s: float | None = json_key("t_to_0.9_s")
    staleness_max: int
    idle_rollout: float
    idle_trainer: float
    busy_gen_s: float
    busy_train_s: float


@dataclass(frozen=True, kw_only=True)
class ModeSummary(Record):
    """One mode over its seeds."""

    acc_final_mean: float
    acc_final_min: float
    acc_final_max: float
    t_to_0_9_s: list[float | None] = json_key("t_to_0.9_s")
    samples_per_s_mean: float


@dataclass(frozen=True, kw_only=True)
class CurvePoint(Record):
    step: int
    wall_s: float
    accuracy: float
    eval_reward: float | None
    train_reward: float | None


@dataclass(frozen=True, kw_only=True)
class RlModes(Result):
    rows: list[ModesRow]
    summary: dict[str, ModeSummary]
    speedup: dict[str, float]
    curves: dict[str, list[CurvePoint]]


@dataclass(frozen=True, kw_only=True)
class ThroughputRow(Record):
    """One mode: medians over interleaved rounds (``rl_modes_throughput.json`` is a list)."""

    mode: str
    samples_per_s_median: float
    samples_per_s_all: list[float]
    speedup: float
    busy_gen_s_median: float
    busy_train_s_median: float
    idle_gen_median: float
    idle_train_median: float
    staleness_max: int


FILES = {"rl_modes": RlModes, "rl_modes_throughput": list[ThroughputRow]}


def _idle(gen: float, train: float) -> str:
    return f"{pct(gen, 0)} / {pct(train, 0)}"


def _seconds_list(values: Sequence[float]) -> str:
    return ", ".join(f"{v:.0f} s" for v in values)


def _summary(mode: str, s: ModeSummary) -> str:
    reached = [t for t in s.t_to_0_9_s if t is not None]
    if s.acc_final_min == s.acc_final_max:
        spread = f"all {len(s.t_to_0_9_s)} at {f(s.acc_final_min, 3)}"
    else:
        spread = f"min {f(s.acc_final_min, 3)}, max {f(s.acc_final_max, 3)}"
    when = f" ({_seconds_list(reached)})" if reached else ""
    return (
        f"{mode}: final accuracy mean {f(s.acc_final_mean, 3)} ({spread}), "
        f"{len(reached)} of {len(s.t_to_0_9_s)} seeds reach 0.9{when}"
    )


def modes() -> str:
    """The learning runs, with the per-mode summary below the table."""
    data = load_result(RlModes, "rl_modes")
    rows = []
    for r in data.rows:
        final = f(r.acc_final, 3)
        best = max((p.accuracy for p in data.curves.get(r.run, [])), default=r.acc_final)
        if best > r.acc_final:
            final += f" ({f(best, 3)})"
        t09 = "-" if r.t_to_0_9_s is None else f"{f(r.t_to_0_9_s, 1)} s"
        rows.append([r.run, r.steps, f(r.wall_s, 1), f(r.samples_per_s, 0), times(r.speedup),
                     f(r.acc_start, 3), final, t09, r.staleness_max,
                     _idle(r.idle_rollout, r.idle_trainer)])  # fmt: skip
    headers = ["run", "steps", "wall s", "samples/s", "vs sync", "acc start", "acc final (best)",
               "t to 0.9", "stale max", "idle gen / train"]  # fmt: skip
    table = md_table(headers, rows)
    parts = [_summary(mode, s) for mode, s in data.summary.items()]
    first = data.rows[0]
    busy = (
        f"Busy seconds in {first.run}: generation {first.busy_gen_s:.0f} s, "
        f"training {first.busy_train_s:.0f} s."
    )
    return f"{table}\n\n" + prose("; ".join(parts) + ".", busy)


def modes_throughput() -> str:
    """The throughput rounds: samples/s, busy and idle time per mode."""
    rows = [
        [r.mode, f(r.samples_per_s_median, 0), ", ".join(f(v, 0) for v in r.samples_per_s_all),
         times(r.speedup), f(r.busy_gen_s_median, 1), f(r.busy_train_s_median, 1),
         _idle(r.idle_gen_median, r.idle_train_median), r.staleness_max]
        for r in load_result(list[ThroughputRow], "rl_modes_throughput")
    ]  # fmt: skip
    headers = ["mode", "samples/s (median)", "rounds", "vs sync", "gen busy s", "train busy s",
               "idle gen / train", "stale max"]  # fmt: skip
    return md_table(headers, rows)


TABLES: dict[str, Renderer] = {"rl.modes": modes, "rl.modes_throughput": modes_throughput}
