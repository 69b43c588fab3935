"""What an actor-learner run returns: eval return, curves, throughput, lag, idle, ledger."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from nobubble.rl.system.experience import LedgerSummary
from nobubble.rl.system.result import run_json

__all__ = ["CurvePoint", "EnvRunResult", "ActorFailure"]


class ActorFailure(RuntimeError):
    """An actor process died or fell silent; the message names it and gives its error's last
    line, ``traceback`` holds the whole report."""

    def __init__(self, actor: str, detail: str) -> None:
        lines = [line for line in detail.strip().splitlines() if line.strip()]
        super().__init__(f"actor {actor} failed: {lines[-1] if lines else detail}")
        self.actor, self.traceback = actor, detail


@dataclass(frozen=True)
class CurvePoint:
    """One point of the learning curve, after an update or an evaluation.

    Attributes:
        wall_s: seconds since the run started (actor start-up included).
        env_steps: environment steps the learner had received.
        train_return: mean return of the last 20 finished training episodes (None: none yet).
        eval_return: mean greedy eval return, on evaluation points only.
    """

    wall_s: float
    env_steps: int
    train_return: float | None
    eval_return: float | None = None


@dataclass(frozen=True)
class EnvRunResult:
    """A finished run.

    Attributes:
        eval_mean_return: mean greedy return over ``eval_returns`` (the last evaluation).
        time_to_target_s, steps_to_target: wall-clock and env steps when an evaluation first
            reached the target (None: not reached).
        env_steps_per_s: env steps received by the learner / wall-clock of the run.
        trained_samples: env steps (transitions) the learner trained on.
        steps: learner updates (the last policy version).
        idle_ratio: per role, the fraction of the run's wall-clock it spent not working
            (``learner``: not in an update; ``inference``: not answering actors, central only).
        staleness_hist: policy lag -> env steps trained with it (summing to ``trained_samples``).
        config: the run's settings (factories by name), for the JSON.
        model: the trained model (the learner's, at the last policy version); not in
            :meth:`to_json`.
    """

    env: str
    arch: str
    actors: int
    envs_per_actor: int
    env_step_delay_ms: float
    seed: int
    eval_mean_return: float
    eval_returns: tuple[float, ...]
    target_return: float | None
    time_to_target_s: float | None
    steps_to_target: int | None
    env_steps: int
    wall_s: float
    env_steps_per_s: float
    trained_samples: int
    steps: int
    idle_ratio: dict[str, float]
    staleness_hist: dict[int, int]
    ledger: LedgerSummary
    curve: tuple[CurvePoint, ...]
    config: dict[str, Any] = field(default_factory=dict)
    model: Any = field(default=None, repr=False, compare=False)

    @property
    def reached_target(self) -> bool:
        return self.time_to_target_s is not None

    @property
    def staleness_max(self) -> int:
        return max(self.staleness_hist, default=0)

    def to_json(self) -> dict[str, Any]:
        """The run as JSON, with the top-level keys of every RL run
        (:data:`~nobubble.rl.system.result.RESULT_KEYS`): the eval return is its
        ``outcome``, a curve point is ``[wall_s, env_steps, train_return, eval_return]``."""
        return run_json(
            config=self.config,
            steps=self.steps,
            wall_s=self.wall_s,
            trained_samples=self.trained_samples,
            staleness_hist=self.staleness_hist,
            idle_ratio=dict(self.idle_ratio),
            ledger=self.ledger,
            curve=[[p.wall_s, p.env_steps, p.train_return, p.eval_return] for p in self.curve],
            outcome={
                "eval_mean_return": self.eval_mean_return,
                "eval_returns": list(self.eval_returns),
                "target_return": self.target_return,
                "reached_target": self.reached_target,
                "time_to_target_s": self.time_to_target_s,
                "steps_to_target": self.steps_to_target,
            },
            details={
                "env": self.env,
                "arch": self.arch,
                "env_steps": self.env_steps,
                "env_steps_per_s": self.env_steps_per_s,
            },
        )
