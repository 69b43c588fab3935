"""What a finished RL run of either producer measured (:class:`RunResult`, :class:`CurvePoint`)
and its pictures: a Chrome trace of the stages, curves, staleness and idle ratios."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nobubble.files import figure
from nobubble.rl.system.experience import LedgerSummary
from nobubble.rl.system.types import Span
from nobubble.trace import Event, summarize, write_chrome_trace

__all__ = [
    "CurvePoint", "RESULT_KEYS", "RunResult", "STAGES", "plot_runs",
    "span_events", "stage_busy", "write_trace",
]  # fmt: skip

STAGES = ("rollout", "reward", "trainer")
"""The stages of a task run, in the order its timelines show them."""


@dataclass(frozen=True)
class CurvePoint:
    """One point of a learning curve, after a learner update or an evaluation."""

    step: int  # learner updates so far (the policy version)
    wall_s: float  # since the run started (an env run: actor start-up included)
    # recent training data's mean return (a task: the last update's mean reward; an env: the
    # last 20 finished episodes); None: none yet
    train_return: float | None = None
    eval_return: float | None = None  # on evaluation points only (an env: greedy episodes)
    accuracy: float | None = None  # a task's evaluations: the share of eval prompts solved
    env_steps: int | None = None  # an env run: env steps the learner had received

    def to_json(self) -> dict[str, Any] | list[Any]:
        """A task's point as ``{step, wall_s, accuracy, eval_reward, train_reward}``, an env
        run's as ``[wall_s, env_steps, train_return, eval_return]``."""
        if self.env_steps is not None:
            return [self.wall_s, self.env_steps, self.train_return, self.eval_return]
        names = ("step", "wall_s", "accuracy", "eval_return", "train_return")
        return {name.replace("_return", "_reward"): getattr(self, name) for name in names}


@dataclass(frozen=True)
class RunResult:
    """What a run measured (:meth:`to_json`: the JSON form): every run fills the fields
    without a default, a task run (``env`` None) and an env run their own below."""

    config: dict[str, Any]
    steps: int  # learner updates
    wall_s: float
    trained_samples: int  # what the learner trained on: task samples or env steps
    curve: list[CurvePoint]
    staleness_hist: dict[int, int]  # policy lag -> trained samples
    idle_ratio: dict[str, float]  # per stage or role: the share of wall_s it did not work
    ledger: LedgerSummary
    # a task run
    initial_accuracy: float | None = None  # at the first evaluation
    final_accuracy: float | None = None  # at the last evaluation
    busy_s: dict[str, float] = field(default_factory=dict)  # per stage
    fates: dict[int, str] = field(default_factory=dict)  # the ledger's, per sample
    group_versions: dict[int, list[int]] = field(default_factory=dict)  # its samples'
    weight_versions: list[int] = field(default_factory=list)  # published
    spans: list[Span] = field(default_factory=list)  # every stage's work, from t0 on
    t0: float = 0.0  # seconds since the epoch
    requeues: list[tuple[int, str]] = field(default_factory=list)  # (group id, reason)
    restarts: list[str] = field(default_factory=list)  # workers restarted
    resumed_from: str | None = None  # the checkpoint folder
    step_metrics: list[dict[str, float]] = field(default_factory=list)  # per update
    token_staleness_hist: dict[int, int] = field(default_factory=dict)  # lag -> tokens
    # an env run
    env: str | None = None  # the env's label
    arch: str | None = None
    actors: int | None = None  # actor processes
    envs_per_actor: int | None = None
    eval_mean_return: float | None = None  # the last evaluation's mean greedy return
    eval_returns: tuple[float, ...] = ()  # its episodes
    target_return: float | None = None
    time_to_target_s: float | None = None  # when an evaluation first reached it (None: never)
    steps_to_target: int | None = None  # env steps then
    env_steps: int | None = None  # received by the learner
    model: Any = field(default=None, repr=False, compare=False)  # trained (env); not in JSON

    @property
    def samples_per_s(self) -> float:
        return self.trained_samples / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def env_steps_per_s(self) -> float | None:
        """Env steps received by the learner / the run's wall-clock (None: a task run)."""
        if self.env_steps is None:
            return None
        return self.env_steps / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def staleness_max(self) -> int:
        return max(self.staleness_hist, default=0)

    @property
    def reached_target(self) -> bool:
        return self.time_to_target_s is not None

    def time_to_accuracy(self, target: float) -> float | None:
        hits = (p.wall_s for p in self.curve if p.accuracy is not None and p.accuracy >= target)
        return next(hits, None)

    def to_json(self) -> dict[str, Any]:
        """The run as JSON, keys :data:`RESULT_KEYS` whichever producer made it: a task's
        ``outcome`` is its accuracies, an env run's its eval return and time to target."""
        outcome, details = _TASK_JSON if self.env is None else _ENV_JSON
        out = {key: _json(getattr(self, key)) for key in RESULT_KEYS[:-2]}
        out["outcome"] = {key: _json(getattr(self, key)) for key in outcome}
        out["details"] = {key: _json(getattr(self, key)) for key in details}
        return out


def _json(value: Any) -> Any:
    """A field as JSON: lists and tuples as lists; a histogram (int keys) sorted with its
    keys as strings; an object with ``to_json`` (a curve point, the ledger) as its own."""
    if hasattr(value, "to_json"):
        return value.to_json()
    if isinstance(value, list | tuple):
        return [_json(v) for v in value]
    if isinstance(value, dict) and all(isinstance(k, int) for k in value):
        return {str(k): v for k, v in sorted(value.items())}
    return value


# The fields of each producer's ``outcome`` and ``details`` in a run's JSON.
_TASK_JSON = (
    ("initial_accuracy", "final_accuracy"),
    ("token_staleness_hist", "busy_s", "restarts", "step_metrics", "resumed_from"),
)
_ENV_JSON = (
    ("eval_mean_return", "eval_returns", "target_return", "reached_target", "time_to_target_s",
     "steps_to_target"),
    ("env", "arch", "env_steps", "env_steps_per_s"),
)  # fmt: skip


RESULT_KEYS = (
    "config", "steps", "wall_s", "trained_samples", "samples_per_s", "staleness_hist",
    "staleness_max", "idle_ratio", "ledger", "curve", "outcome", "details",
)  # fmt: skip
"""The top-level keys of an RL run's JSON (:meth:`RunResult.to_json`), whichever producer."""


def span_events(spans: list[Span], t0: float, end: float = math.inf) -> list[Event]:
    """The stages' busy spans within ``[t0, end]`` as trace events, in start order: one rank
    per stage of :data:`STAGES`, microseconds since ``t0``."""
    events = []
    for s in spans:
        if s.end_s < t0 or s.stage not in STAGES:
            continue
        start = max(s.start_s, t0)
        events.append(
            Event(
                name=s.name,
                cat=s.stage,
                rank=STAGES.index(s.stage),
                start_us=(start - t0) * 1e6,
                dur_us=max(0.0, min(s.end_s, end) - start) * 1e6,
                args={k: v for k, v in s.args.items() if isinstance(v, int | float | str)},
            )
        )
    events.sort(key=lambda e: e.start_us)
    return events


def stage_busy(
    spans: list[Span], t0: float, end: float
) -> tuple[dict[str, float], dict[str, float]]:
    """Busy seconds and idle ratio per stage over ``[t0, end]``: the union of the stage's
    workers' spans (:func:`nobubble.trace.summarize`; evaluation counts as trainer work)."""
    busy_us = {r.rank: r.busy_us for r in summarize(span_events(spans, t0, end))}
    busy = {stage: busy_us.get(rank, 0.0) / 1e6 for rank, stage in enumerate(STAGES)}
    span_s = max(end - t0, 1e-9)
    return busy, {stage: max(0.0, 1.0 - b / span_s) for stage, b in busy.items()}


def write_trace(result: RunResult, path: str | Path) -> Path:
    """Write the per-stage busy/idle timeline of ``result`` as a Chrome trace."""
    return write_chrome_trace(
        path, span_events(result.spans, result.t0), rank_names=dict(enumerate(STAGES))
    )


def plot_runs(results: Mapping[str, RunResult], path: str | Path, *, title: str = "") -> Path:
    """One PNG/SVG of runs by label: the learning curve against wall-clock and against
    progress (a task's accuracy against learner updates; an env run's return against env
    steps, the mean of its last 20 training episodes as a line and its greedy evaluations as
    dots, its target dashed), the staleness histogram and each stage's or role's idle ratio."""
    with figure(path, 2, 2, figsize=(11, 7.5)) as (fig, ((ax_t, ax_s), (ax_h, ax_i))):
        env = any(r.env is not None for r in results.values())
        for label, r in results.items():
            for ax, x in ((ax_t, "wall_s"), (ax_s, "env_steps" if env else "step")):
                _draw_curve(ax, r, x, label)
        progress = "environment steps" if env else "trainer step"
        targets = {r.target_return for r in results.values() if r.target_return is not None}
        for ax, xl in ((ax_t, "wall-clock (s)"), (ax_s, progress)):
            for target in targets:
                ax.axhline(target, ls="--", color="grey", lw=1, label=f"target {target:g}")
            ax.set_xlabel(xl)
            ax.set_ylabel("episode return" if env else "exact-match accuracy (eval set)")
            if not env:
                ax.set_ylim(-0.02, 1.02)
            ax.grid(alpha=0.3)
            ax.legend(fontsize=8)
        _draw_bars(ax_h, ax_i, results)
        if title:
            fig.suptitle(title)
    return Path(path)


def _draw_curve(ax: Any, r: RunResult, x: str, label: str) -> None:
    """``r``'s curve on ``ax`` against the :class:`CurvePoint` field ``x``."""

    def xy(y: str) -> tuple[list[Any], list[Any]]:  # the points that have a ``y``
        points = [p for p in r.curve if getattr(p, y) is not None]
        return [getattr(p, x) for p in points], [getattr(p, y) for p in points]

    if r.env is None:
        ax.plot(*xy("accuracy"), marker="o", ms=3, label=label)
    else:
        line = ax.plot(*xy("train_return"), lw=1.2, label=label)[0]
        ax.plot(*xy("eval_return"), "o", ms=5, color=line.get_color())


def _draw_bars(ax_h: Any, ax_i: Any, results: Mapping[str, RunResult]) -> None:
    """The staleness histograms on ``ax_h`` and the idle ratios on ``ax_i``, side by side."""
    width = 0.8 / max(1, len(results))
    max_lag = max((r.staleness_max for r in results.values()), default=0)
    stages = list(dict.fromkeys(s for r in results.values() for s in r.idle_ratio))
    for i, (label, r) in enumerate(results.items()):
        total = max(1, sum(r.staleness_hist.values()))
        xs = list(range(max_lag + 1))
        ax_h.bar([x + i * width for x in xs], [r.staleness_hist.get(x, 0) / total for x in xs],
                 width=width, label=label)  # fmt: skip
        ax_i.bar([j + i * width for j in range(len(stages))],
                 [r.idle_ratio.get(s, 0.0) for s in stages], width=width, label=label)  # fmt: skip
    center = width * (len(results) - 1) / 2  # ticks under each group of bars
    ax_h.set_xticks([x + center for x in range(max_lag + 1)], range(max_lag + 1))
    ax_h.set_xlabel("staleness (trainer version - sample version)")
    ax_h.set_ylabel("share of trained samples")
    ax_h.legend(fontsize=8)
    ax_i.set_xticks([j + center for j in range(len(stages))], stages)
    ax_i.set_ylabel("idle ratio")
    ax_i.set_ylim(0, 1)
    ax_i.legend(fontsize=8)
