"""The reward stage: verify responses, slowly or unreliably if the experiment says so.

A reward function may be slow (a sandbox, a judge model) and may fail. :func:`score_group`
calls it for every sample with up to ``max_retries`` retries; a sample whose reward still
raises is recorded as *failed* with the error text - never scored 0 in silence - and the
buffer drops its group with the stated reason ``reward_failed``.

For experiments, :class:`RewardConfig` adds a delay per call and a failure probability per
attempt (decided by a seeded hash of sample id and attempt, so runs are reproducible).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass

from nobubble.rl.system.tasks import Task
from nobubble.rl.system.types import SampleGroup, Span

__all__ = ["RewardConfig", "RewardError", "InjectedRewardFailure", "score_group"]

RewardFn = Callable[[str, str], float]


class RewardError(RuntimeError):
    """A reward function returned something that is not a finite number in [0, 1]."""


class InjectedRewardFailure(RuntimeError):
    """A failure injected by ``RewardConfig.failure_rate`` (stands for a crashed verifier)."""


@dataclass(frozen=True, kw_only=True)
class RewardConfig:
    """How the reward stage behaves.

    Attributes:
        delay_s: seconds each reward call sleeps (a slow verifier), >= 0.
        failure_rate: probability that one attempt raises, in [0, 1].
        max_retries: retries after a failed attempt, >= 0.
        seed: seed of the injected failures.
    """

    delay_s: float = 0.0
    failure_rate: float = 0.0
    max_retries: int = 2
    seed: int = 0

    def __post_init__(self) -> None:
        if not self.delay_s >= 0:
            raise ValueError(f"RewardConfig.delay_s={self.delay_s} must be >= 0 seconds")
        if not 0.0 <= self.failure_rate <= 1.0:
            raise ValueError(f"RewardConfig.failure_rate={self.failure_rate} must be in [0, 1]")
        if self.max_retries < 0:
            raise ValueError(f"RewardConfig.max_retries={self.max_retries} must be >= 0")


def _attempt(
    task: Task, cfg: RewardConfig, sample_id: int, attempt: int, prompt: str, response: str
) -> float:
    if cfg.delay_s:
        time.sleep(cfg.delay_s)
    if (
        cfg.failure_rate
        and random.Random(hash((cfg.seed, sample_id, attempt))).random() < cfg.failure_rate
    ):
        raise InjectedRewardFailure(f"injected failure (sample {sample_id}, attempt {attempt})")
    value = task.reward(prompt, response)
    if not (isinstance(value, int | float) and 0.0 <= value <= 1.0):
        raise RewardError(f"reward {value!r} for sample {sample_id} is not a number in [0, 1]")
    return float(value)


def score_group(task: Task, group: SampleGroup, cfg: RewardConfig) -> tuple[SampleGroup, Span]:
    """Score every sample of ``group``; returns the scored group and the busy span.

    A sample whose reward raises on all ``1 + max_retries`` attempts gets
    ``reward=None`` and ``reward_error`` = the last error.
    """
    start = time.time()
    out = []
    retries = 0
    for s in group.samples:
        error = None
        for attempt in range(cfg.max_retries + 1):
            try:
                value = _attempt(task, cfg, s.sample_id, attempt, s.prompt, s.response)
            except Exception as err:  # noqa: BLE001 - any verifier failure is recorded, not hidden
                error = f"{type(err).__name__}: {err}"
                retries += attempt < cfg.max_retries
                continue
            out.append(s.scored(value, time.time()))
            break
        else:
            out.append(s.failed(f"{error} (after {cfg.max_retries} retries)", time.time()))
    scored = group.with_samples(tuple(out))
    span = Span(
        "reward",
        f"reward g{group.group_id}",
        start,
        time.time(),
        {"group": group.group_id, "retries": retries, "failed": sum(s.reward_failed for s in out)},
    )
    return scored, span
