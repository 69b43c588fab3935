"""Measured step time, bubble and memory of a run, next to the simulator's prediction.

Measured, per step, from the recorded op events (same definitions as
:mod:`nobubble.pipeline.simulate`): a rank's span is its first op start to its last op end,
its busy time the sum of its op durations; ``bubble_rate = (max span - max busy) / max span``.
``makespan`` is the step's last op end minus its first op start over all ranks; ``step_time``
is barrier to barrier (adds the send drain and the optimizer step). Medians over the steps.

Predicted: :func:`nobubble.pipeline.simulate.simulate` of the same schedule with the
profiled per-stage costs (:class:`~nobubble.pipeline.runtime.profile.Profile`).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass

from nobubble.pipeline.runtime.executor import WAIT, RankResult, TrainConfig
from nobubble.pipeline.runtime.profile import Profile
from nobubble.pipeline.simulate import SimResult, simulate

__all__ = ["RunSummary", "summarize_run", "simulate_run", "measured_bubble"]


@dataclass(frozen=True)
class RunSummary:
    """One schedule's run: measured (median over steps) and predicted. Seconds, bytes."""

    schedule: str
    num_ranks: int
    num_stages: int
    num_microbatches: int
    num_steps: int
    step_time_s: float
    makespan_s: float
    bubble_rate: float
    peak_activation_bytes: tuple[int, ...]
    losses: tuple[float, ...]
    sim_makespan_s: float | None
    sim_bubble_rate: float | None
    sim_peak_activation_bytes: tuple[float, ...] | None

    def to_dict(self) -> dict:
        return asdict(self)


def measured_bubble(results: Sequence[RankResult], step: int) -> tuple[float, float]:
    """(makespan in seconds, bubble rate) of ``step`` from the ranks' events."""
    spans, busy, lo, hi = [], [], float("inf"), float("-inf")
    for r in results:
        evs = [e for e in r.events if e.args.get("step") == step and e.cat != WAIT]
        if not evs:
            continue
        start, end = min(e.start_us for e in evs), max(e.end_us for e in evs)
        spans.append(end - start)
        busy.append(sum(e.dur_us for e in evs))
        lo, hi = min(lo, start), max(hi, end)
    max_span = max(spans)
    return (hi - lo) / 1e6, (max_span - max(busy)) / max_span if max_span > 0 else 0.0


def simulate_run(config: TrainConfig, profile: Profile) -> SimResult:
    """The simulator's step of ``config``'s schedule (with its recompute) at ``profile``'s
    costs (ms, bytes): the prediction :func:`summarize_run` reports and ``pp run --plot``
    draws."""
    sched = config.schedule
    return simulate(sched, profile.cost_model(sched, recompute=config.recompute))


def summarize_run(
    config: TrainConfig, results: Sequence[RankResult], profile: Profile | None = None
) -> RunSummary:
    """Measured medians of a run and, given a profile, the simulator's prediction."""
    sched = config.schedule
    steps = range(config.num_steps)
    per_step = [measured_bubble(results, s) for s in steps]
    step_times = [max(r.step_times_s[s] for r in results) for s in steps]
    (losses,) = [r.losses for r in results if r.losses is not None]
    sim_makespan = sim_bubble = sim_peak = None
    if profile is not None:
        sim = simulate_run(config, profile)
        sim_makespan, sim_bubble = sim.makespan / 1e3, sim.bubble_rate  # profile is in ms
        sim_peak = tuple(sim.peak_memory)
    return RunSummary(
        schedule=sched.name,
        num_ranks=sched.num_ranks,
        num_stages=sched.num_stages,
        num_microbatches=sched.num_microbatches,
        num_steps=config.num_steps,
        step_time_s=statistics.median(step_times),
        makespan_s=statistics.median(m for m, _ in per_step),
        bubble_rate=statistics.median(b for _, b in per_step),
        peak_activation_bytes=tuple(r.peak_activation_bytes for r in results),
        losses=tuple(losses),
        sim_makespan_s=sim_makespan,
        sim_bubble_rate=sim_bubble,
        sim_peak_activation_bytes=sim_peak,
    )
