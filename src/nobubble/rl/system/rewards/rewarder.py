"""The reward stage: a weighted sum of reward sources, retried, failures recorded.

A sample's reward is ``sum(weight * fn(prompt, response))`` over the run's
:class:`RewardSource` s, plus the reward service's (``RunConfig.reward_url``, asked once per
group, :class:`~nobubble.rl.system.rewards.remote.RemoteReward`); every value is a finite
real (:func:`~nobubble.rl.system.tasks.as_reward`). A sample whose sources still raise
after ``max_retries`` retries, or whose group the service failed, is recorded as failed with
the error text - never scored 0 in silence - and the buffer drops its group
(``reward_failed``). :class:`RewardWatch` ends a run whose reward keeps failing.
"""

from __future__ import annotations

import inspect
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from nobubble.rl.system.imports import is_import_path, load_object
from nobubble.rl.system.tasks import RewardError, TaskSpec, as_reward
from nobubble.rl.system.types import Sample, SampleGroup, Span
from nobubble.validation import finite

if TYPE_CHECKING:
    from nobubble.rl.system.config.stages import RewardConfig

__all__ = [
    "RewardError",
    "RewardFailure",
    "RewardWatch",
    "check_reward_fn",
    "InjectedRewardFailure",
    "RewardSource",
    "parse_reward",
    "Rewarder",
]

RewardFn = Callable[[str, str], float]


class RewardFailure(RuntimeError):
    """Every reward attempt of many groups in a row failed: the run cannot learn."""


class InjectedRewardFailure(RuntimeError):
    """A failure injected by ``RewardConfig.failure_rate`` (stands for a crashed verifier)."""


class RewardWatch:
    """Counts groups whose reward failed in a row; :meth:`record` raises
    :class:`RewardFailure` once ``give_up_groups`` did, or the streak lasted ``give_up_s``
    seconds (wall-clock, from its first group's ``t_admitted``), naming the source, the count
    and the last error."""

    def __init__(self, cfg: RewardConfig, source: str) -> None:
        self.cfg, self.source = cfg, source
        self.streak = 0
        self._since = 0.0  # wall-clock start of the current streak

    def record(self, group: SampleGroup) -> None:
        if not group.reward_failed:
            self.streak = 0
            return
        now = time.time()
        if self.streak == 0:
            self._since = group.t_admitted if 0 < group.t_admitted <= now else now
        self.streak += 1
        if self.streak >= self.cfg.give_up_groups or now - self._since >= self.cfg.give_up_s:
            error = next(s.reward_error for s in group.samples if s.reward_failed)
            raise RewardFailure(
                f"reward {self.source}: all of the last {self.streak} groups failed, "
                f"{now - self._since:.0f}s without a scored one; last error: {error}"
            )


def check_reward_fn(fn: Any, name: str) -> None:
    """Refuse a reward that cannot be called as ``fn(prompt, response)`` (ValueError)."""
    if not callable(fn):
        raise ValueError(f"reward {name!r} is not callable; name a function")
    try:
        inspect.signature(fn).bind("prompt", "response")
    except TypeError as err:
        raise ValueError(f"reward {name!r} must take (prompt, response): {err}") from None
    except ValueError:
        pass  # a builtin without a signature: judged when called


@dataclass(frozen=True)
class RewardSource:
    """One weighted term of the reward: ``weight * fn(prompt, response)``; ``fn`` is
    ``"task"`` (the task's reward), an import path, or a picklable callable."""

    fn: str | RewardFn = "task"
    weight: float = 1.0

    def __post_init__(self) -> None:
        if not finite(self.weight):
            raise ValueError(f"reward weight {self.weight} must be a finite number")
        if isinstance(self.fn, str) and self.fn != "task" and not is_import_path(self.fn):
            raise ValueError(f"reward {self.fn!r} is neither 'task' nor an import path 'module:fn'")
        if self.fn != "task":
            check_reward_fn(self.resolve(None), str(getattr(self.fn, "__name__", self.fn)))

    def resolve(self, task: TaskSpec | None) -> RewardFn:
        if self.fn == "task":
            assert task is not None
            return task.task.reward
        return load_object(self.fn, "reward") if isinstance(self.fn, str) else self.fn


def parse_reward(text: str) -> RewardSource:
    """``"module:fn"``, ``"module:fn=0.5"``, ``"task"`` or ``"task=2"`` as a source."""
    fn, sep, weight = text.rpartition("=")
    if not sep:
        return RewardSource(text)
    try:
        w = float(weight)
    except ValueError:
        raise ValueError(f"reward {text!r}: weight {weight!r} is not a number") from None
    return RewardSource(fn, w)


class Rewarder:
    """Scores groups with the run's reward sources (see the module docstring).

    Args:
        task: the task (its reward is the source ``"task"``).
        sources: the local sources; empty means ``("task", 1.0)`` unless ``remote`` is set.
        cfg: delays, injected failures (seeded by sample id and attempt), retries.
        remote: a batched scorer ``.score(prompts, responses) -> (rewards, retries)``, or None.
    """

    def __init__(
        self,
        task: TaskSpec,
        sources: tuple[RewardSource, ...],
        cfg: RewardConfig,
        remote: Any = None,
    ) -> None:
        if not sources and remote is None:
            sources = (RewardSource(),)
        self.cfg = cfg
        self.remote = remote
        self._fns = [(s.resolve(task), s.weight, str(s.fn)) for s in sources]

    def _attempt(self, s: Sample, attempt: int) -> float:
        cfg = self.cfg
        if cfg.delay_s:
            time.sleep(cfg.delay_s)
        if random.Random(hash((cfg.seed, s.sample_id, attempt))).random() < cfg.failure_rate:
            raise InjectedRewardFailure(
                f"injected failure (sample {s.sample_id}, attempt {attempt})"
            )
        return sum(w * as_reward(fn(s.prompt, s.response), name) for fn, w, name in self._fns)

    def _score(self, s: Sample) -> tuple[float | None, str | None, int]:
        """``(reward, None, retries)``, or ``(None, last error, retries)`` when every
        attempt raised."""
        error = ""
        for attempt in range(self.cfg.max_retries + 1):
            try:
                return self._attempt(s, attempt), None, attempt
            except Exception as err:  # noqa: BLE001 - any verifier failure is recorded
                error = f"{type(err).__name__}: {err} (after {self.cfg.max_retries} retries)"
        return None, error, self.cfg.max_retries

    def score_group(self, group: SampleGroup) -> tuple[SampleGroup, Span]:
        """The group with every sample scored or failed (``reward_error`` = the last error;
        a remote failure fails every sample), and the busy span."""
        start = time.time()
        scores = [self._score(s) for s in group.samples]
        retries = sum(r for _, _, r in scores)
        if self.remote is not None:
            try:
                remote, used = self.remote.score(
                    [s.prompt for s in group.samples], [s.response for s in group.samples]
                )
                retries += used
                scores = [(v if v is None else v + r, e, 0) for (v, e, _), r in zip(scores, remote)]
            except Exception as err:  # noqa: BLE001 - the service's failure is recorded
                scores = [(None, e or f"{type(err).__name__}: {err}", 0) for _, e, _ in scores]
        now = time.time()
        out = tuple(
            s.scored(v, now) if v is not None else s.failed(str(e), now)
            for s, (v, e, _) in zip(group.samples, scores)
        )
        failed = sum(s.reward_failed for s in out)
        info = {"group": group.group_id, "retries": retries, "failed": failed}
        span = Span("reward", f"reward g{group.group_id}", start, now, info)
        return group.with_samples(out), span
