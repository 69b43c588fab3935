"""What a finished RL run measured: :class:`RunResult`, its curve, busy and idle time."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from nobubble.rl.system.experience import LedgerSummary
from nobubble.rl.system.types import Span

__all__ = ["CurvePoint", "RESULT_KEYS", "RunResult", "run_json", "stage_busy"]


@dataclass(frozen=True)
class CurvePoint:
    """One evaluation: policy version, wall-clock seconds since start, accuracy, rewards."""

    step: int
    wall_s: float
    accuracy: float
    eval_reward: float
    train_reward: float | None


@dataclass(frozen=True)
class RunResult:
    """What a run measured (see :meth:`to_json` for the machine-readable form)."""

    config: dict[str, Any]
    steps: int
    wall_s: float
    trained_samples: int
    initial_accuracy: float
    final_accuracy: float
    curve: list[CurvePoint]
    staleness_hist: dict[int, int]
    idle_ratio: dict[str, float]
    busy_s: dict[str, float]
    ledger: LedgerSummary
    fates: dict[int, str]
    group_versions: dict[int, list[int]]
    weight_versions: list[int]
    spans: list[Span]
    t0: float
    requeues: list[tuple[int, str]] = field(default_factory=list)
    restarts: list[str] = field(default_factory=list)
    resumed_from: str | None = None
    step_metrics: list[dict[str, float]] = field(default_factory=list)
    token_staleness_hist: dict[int, int] = field(default_factory=dict)  # trained tokens by lag

    @property
    def samples_per_s(self) -> float:
        return self.trained_samples / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def staleness_max(self) -> int:
        return max(self.staleness_hist, default=0)

    def time_to_accuracy(self, target: float) -> float | None:
        for p in self.curve:
            if p.accuracy >= target:
                return p.wall_s
        return None

    def to_json(self) -> dict[str, Any]:
        """The run as JSON, with the top-level keys of every RL run (:data:`RESULT_KEYS`, the
        environment path's too): the task's accuracies are its ``outcome``."""
        return run_json(
            config=self.config,
            steps=self.steps,
            wall_s=self.wall_s,
            trained_samples=self.trained_samples,
            staleness_hist=self.staleness_hist,
            idle_ratio=self.idle_ratio,
            ledger=self.ledger,
            curve=[asdict(p) for p in self.curve],
            outcome={
                "initial_accuracy": self.initial_accuracy,
                "final_accuracy": self.final_accuracy,
            },
            details={
                "token_staleness_hist": {
                    str(k): v for k, v in sorted(self.token_staleness_hist.items())
                },
                "busy_s": self.busy_s,
                "restarts": self.restarts,
                "step_metrics": self.step_metrics,
                "resumed_from": self.resumed_from,
            },
        )


RESULT_KEYS = (
    "config", "steps", "wall_s", "trained_samples", "samples_per_s", "staleness_hist",
    "staleness_max", "idle_ratio", "ledger", "curve", "outcome", "details",
)  # fmt: skip
"""The top-level keys of an RL run's JSON, whichever producer made it: ``steps`` are learner
updates, ``staleness_hist`` counts trained samples by lag, ``outcome`` holds what the run
reached (accuracy, or eval return and time to target), ``details`` the producer's own."""


def run_json(
    *,
    config: dict[str, Any],
    steps: int,
    wall_s: float,
    trained_samples: int,
    staleness_hist: dict[int, int],
    idle_ratio: dict[str, float],
    ledger: LedgerSummary,
    curve: list[Any],
    outcome: dict[str, Any],
    details: dict[str, Any],
) -> dict[str, Any]:
    """One RL run as JSON, keys :data:`RESULT_KEYS` (``samples_per_s`` and
    ``staleness_max`` derived here)."""
    return {
        "config": config,
        "steps": steps,
        "wall_s": wall_s,
        "trained_samples": trained_samples,
        "samples_per_s": trained_samples / wall_s if wall_s > 0 else 0.0,
        "staleness_hist": {str(k): v for k, v in sorted(staleness_hist.items())},
        "staleness_max": max(staleness_hist, default=0),
        "idle_ratio": idle_ratio,
        "ledger": ledger.to_json(),
        "curve": curve,
        "outcome": outcome,
        "details": details,
    }


def stage_busy(
    spans: list[Span], t0: float, end: float
) -> tuple[dict[str, float], dict[str, float]]:
    """Busy seconds and idle ratio per stage over ``[t0, end]`` (union of the stage's
    workers' spans; evaluation counts as trainer work)."""
    out_busy, out_idle = {}, {}
    span_s = max(end - t0, 1e-9)
    for stage in ("rollout", "reward", "trainer"):
        ivs = sorted((max(s.start_s, t0), min(s.end_s, end)) for s in spans if s.stage == stage)
        # cur_s is read only while cur_e is set (the current merged interval)
        busy, cur_s = 0.0, 0.0
        cur_e: float | None = None
        for a, b in ivs:
            if b <= a:
                continue
            if cur_e is None or a > cur_e:
                busy += 0.0 if cur_e is None else cur_e - cur_s
                cur_s, cur_e = a, b
            else:
                cur_e = max(cur_e, b)
        busy += 0.0 if cur_e is None else cur_e - cur_s
        out_busy[stage] = busy
        out_idle[stage] = max(0.0, 1.0 - busy / span_s)
    return out_busy, out_idle
