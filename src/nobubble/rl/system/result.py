"""What a finished RL run measured: one :class:`RunResult` and one :class:`CurvePoint` for
both producers (a task's groups of responses, an environment's trajectories)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from nobubble.rl.system.experience import LedgerSummary
from nobubble.rl.system.types import Span
from nobubble.trace import Event, summarize

__all__ = ["CurvePoint", "RESULT_KEYS", "RunResult", "STAGES", "span_events", "stage_busy"]

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
        return {
            "step": self.step,
            "wall_s": self.wall_s,
            "accuracy": self.accuracy,
            "eval_reward": self.eval_return,
            "train_reward": self.train_return,
        }


@dataclass(frozen=True)
class RunResult:
    """What a run measured, whichever producer made it (:meth:`to_json`: the JSON form).

    Every run fills the fields without a default: ``steps`` are learner updates,
    ``trained_samples`` what the learner trained on (task samples or env steps),
    ``staleness_hist`` policy lag -> trained samples, ``idle_ratio`` per stage or role the
    fraction of the wall-clock it did not work. A task run (``env`` None) and an env run fill
    their own fields below; ``model`` (an env run's trained model) is not in the JSON.
    """

    config: dict[str, Any]
    steps: int
    wall_s: float
    trained_samples: int
    curve: list[CurvePoint]
    staleness_hist: dict[int, int]
    idle_ratio: dict[str, float]
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
    model: Any = field(default=None, repr=False, compare=False)

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
        for p in self.curve:
            if p.accuracy is not None and p.accuracy >= target:
                return p.wall_s
        return None

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
"""The top-level keys of an RL run's JSON, whichever producer made it: ``steps`` are learner
updates, ``staleness_hist`` counts trained samples by lag, ``outcome`` holds what the run
reached (accuracy, or eval return and time to target), ``details`` the producer's own."""


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
