"""``benchmarks/rl_vs_trl.py``: TRL's GRPOTrainer against nobubble sync and fully-async on
the same task and policy (docs/rl/own-model.md)."""

from __future__ import annotations

from dataclasses import dataclass

from benchmarks._common import Record, Result, load_result, optional
from benchmarks.records import Renderer, count, f, md_table, prose, times
from benchmarks.records.rl_modes import CurvePoint  # the same eval point, one record


@dataclass(frozen=True, kw_only=True)
class PolicyShape(Record):
    name: str
    n_layer: int
    n_embd: int
    n_head: int


@dataclass(frozen=True, kw_only=True)
class TrlSetup(Record):
    """The benchmark's flags and what it ran on; ``versions``: package -> version (None: not
    installed, as TRL on a ``--only nobubble`` run without the peer extra)."""

    steps: int
    prompts_per_step: int
    group_size: int
    lr: float
    threads: int
    seed: int
    only: str | None
    out: str
    task: str
    policy: PolicyShape
    eval_every: int
    versions: dict[str, str | None]
    cpu_count: int
    torch_threads: int


@dataclass(frozen=True, kw_only=True)
class GRPORun(Record):
    """One trainer's run; the TRL-only and nobubble-only figures are optional."""

    steps: int | None = optional()
    trained_samples: int | None = optional()
    samples_per_s: float
    wall_s: float
    samples_per_s_excl_eval: float | None = optional()
    eval_s: float | None = optional()
    median_step_ms: float | None = optional()
    samples_per_s_median_step: float | None = optional()
    initial_accuracy: float
    final_accuracy: float
    train_reward_first10: float | None = optional()
    train_reward_last10: float | None = optional()
    trl_loss_type: str | None = optional()
    trl_scale_rewards: str | None = optional()
    curve: list[CurvePoint]
    idle_ratio: dict[str, float] | None = optional()
    staleness_hist: dict[str, int] | None = optional()


@dataclass(frozen=True, kw_only=True)
class SkippedRun(Record):
    """A trainer that could not run (its package missing): why."""

    skipped: str


@dataclass(frozen=True, kw_only=True)
class RlVsTrl(Result):
    setup: TrlSetup
    runs: dict[str, GRPORun | SkippedRun]
    ratios: dict[str, float]


FILES = {"rl_vs_trl": RlVsTrl}


def _first_wall(curve: list[CurvePoint], level: float) -> float | None:
    return next((p.wall_s for p in curve if (p.eval_reward or 0) >= level), None)


def vs_trl() -> str:
    """TRL's GRPOTrainer against nobubble sync and fully-async."""
    data = load_result(RlVsTrl, "rl_vs_trl")
    setup = data.setup
    runs = {name: r for name, r in data.runs.items() if isinstance(r, GRPORun)}
    base, level = runs["trl"].samples_per_s, 0.5
    rows = []
    for name, r in runs.items():
        rewards = [p.eval_reward or 0.0 for p in r.curve]
        t_half = _first_wall(r.curve, level)
        rows.append([
            name, count(r.samples_per_s), times(r.samples_per_s / base), f(r.wall_s),
            f"{f(rewards[0], 2)} -> {f(max(rewards), 2)}", "-" if t_half is None else f(t_half),
            f"{f(r.initial_accuracy, 2)} -> {f(r.final_accuracy, 2)}",
        ])  # fmt: skip
    table = md_table(
        ["run", "samples/s", "vs TRL", "wall s", "eval reward start -> best",
         f"s to reward {level}", "exact match"],
        rows,
    )  # fmt: skip
    v = setup.versions
    ratio = runs["nobubble-fully-async"].samples_per_s / base
    verdict = "meets" if ratio >= 2 else "misses"
    note = (
        f"{setup.steps} steps of {setup.prompts_per_step} prompts x {setup.group_size} "
        f"completions, lr {setup.lr}, seed {setup.seed}, on {setup.cpu_count} cores "
        f"(TRL {v['trl']}, transformers {v['transformers']}, torch {v['torch']}). Fully-async "
        f"delivers {times(ratio)} TRL's samples/s, which {verdict} the 2x goal. Samples/s counts "
        "trained completions per second of wall clock from the first step to the last, the "
        "periodic greedy evaluations included on both sides."
    )
    return f"{table}\n\n{prose(note)}"


TABLES: dict[str, Renderer] = {"rl.vs_trl": vs_trl}
