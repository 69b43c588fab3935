"""``benchmarks/rl_actor_learner.py``: IMPALA, SEED RL and Sample Factory placements beside
Stable-Baselines3 and TorchRL PPO on CartPole-v1, and the other environments' suite
(docs/rl/system.md)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from benchmarks._common import Record, Result, load_result, optional
from benchmarks.records import Renderer, count, f, md_table


@dataclass(frozen=True, kw_only=True)
class Spread(Record):
    """Over the seeds; ``None`` where no seed has a value."""

    mean: float | None
    min: float | None
    max: float | None
    stdev: float | None


@dataclass(frozen=True, kw_only=True)
class ArchSummary(Record):
    reached: str
    time_to_475_s: Spread
    env_steps_per_s: Spread


@dataclass(frozen=True, kw_only=True)
class Dropped(Record):
    lag: int
    shutdown: int


@dataclass(frozen=True, kw_only=True)
class RunLedger(Record):
    """The run's ledger summary (``LedgerSummary.to_json``): every generated trajectory is
    trained or dropped for a stated reason, with no gap in any actor's sequence: ``ok``."""

    generated: int
    trained: int
    dropped: dict[str, int]
    requeued: int
    reused: int
    by_learner: dict[str, int]
    gaps: list[Any]
    ok: bool


@dataclass(frozen=True, kw_only=True)
class Ledger(Record):
    """Files written before the one ledger: every sample produced is used or dropped (for
    lag, or at shutdown): ``whole``."""

    produced: int
    used: int
    dropped: Dropped
    whole: bool


@dataclass(frozen=True, kw_only=True)
class CartPoleRun(Record):
    """One seed; the peers (SB3, TorchRL) have no actors, idle ratios, lag or ledger."""

    time_to_475_s: float | None
    steps_to_475: int | None
    env_steps_per_s: float
    eval_mean_return: float
    wall_s: float
    env_steps: int
    actors: int | None = optional()
    idle_ratio: dict[str, float] | None = optional()
    staleness_max: int | None = optional()
    ledger: RunLedger | Ledger | None = optional()
    seed: int


@dataclass(frozen=True, kw_only=True)
class ArchResult(Record):
    summary: ArchSummary
    runs: list[CartPoleRun]


@dataclass(frozen=True, kw_only=True)
class RlActorLearner(Result):
    """``results``: ``architecture@delay`` (``impala@0ms``) -> its seeds."""

    env: str
    target_return: float
    eval_episodes: int
    cpu_count: int
    load_average_at_end: list[float]
    results: dict[str, ArchResult]


@dataclass(frozen=True, kw_only=True)
class EnvRun(Record):
    """One seed on one environment of the suite."""

    start_return: float | None = optional()
    start_success_sampled: float | None = optional()
    seed: int
    reached: bool
    time_to_target_s: float | None
    steps_to_target: int | None
    eval_mean_return: float
    wall_s: float
    env_steps: int
    env_steps_per_s: float
    idle_ratio: dict[str, float]
    staleness_max: int
    ledger: RunLedger | Ledger
    eval_curve: list[list[float]]


@dataclass(frozen=True, kw_only=True)
class EnvArch(Record):
    reached: str
    time_to_target_s: Spread
    runs: list[EnvRun]


@dataclass(frozen=True, kw_only=True)
class RlActorLearnerEnvs(Result):
    """``--suite envs``: Acrobot per architecture, and the text tasks (their options and
    run settings as the benchmark passed them)."""

    acrobot: dict[str, EnvArch]
    guess_number: dict[str, Any]
    rg: dict[str, Any]
    text_defaults: dict[str, Any]
    cpu_count: int
    load_average_at_end: list[float]


FILES = {"rl_actor_learner": RlActorLearner, "rl_actor_learner_envs": RlActorLearnerEnvs}


def _s(value: float | None) -> str:
    return "-" if value is None else f(value)


def actor_learner() -> str:
    """Time to return 475 on CartPole-v1 and env steps/s, each architecture beside
    Stable-Baselines3 PPO, with and without a 1 ms env step."""
    data = load_result(RlActorLearner, "rl_actor_learner")
    rows = []
    for name, res in data.results.items():
        arch, delay = name.split("@")
        t, rate = res.summary.time_to_475_s, res.summary.env_steps_per_s.mean
        rows.append([
            arch, delay, res.summary.reached, _s(t.mean) + " s", _s(t.stdev) + " s",
            ", ".join(_s(r.time_to_475_s) for r in res.runs),
            "-" if rate is None else count(rate),
        ])  # fmt: skip
    headers = ["architecture", "env step delay", "seeds reaching 475", "time to 475 (mean)",
               "sd", "per seed (s)", "env steps/s"]  # fmt: skip
    return (
        f"{md_table(headers, rows, 'llrrrlr')}\n\n{data.eval_episodes} greedy evaluation "
        f"episodes per check; {data.cpu_count} cores, load average "
        f"{data.load_average_at_end[0]:.1f} at the end of the run."
    )


TABLES: dict[str, Renderer] = {"rl.actor_learner": actor_learner}
