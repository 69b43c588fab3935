"""The reward stage: verify responses, slowly or unreliably if the experiment says so.

The reward of a sample is a weighted sum of *reward sources* (:class:`RewardSource`):

- ``"task"`` - the task's own ``reward(prompt, response)`` (the default, weight 1);
- ``"module:fn"`` / ``"file.py:fn"`` or a callable ``fn(prompt, response) -> float``;
- a remote reward service (``RunConfig.reward_url``), asked once per group in one batch
  (:class:`~nobubble.rl.system.rewards.remote.RemoteReward`).

Every value may be any finite real. :class:`Rewarder` calls the local sources for every
sample with up to ``max_retries`` retries; a sample whose reward still raises (or is not a
finite number) is recorded as *failed* with the error text - never scored 0 in silence -
and the buffer drops its group with the stated reason ``reward_failed``. A remote service
that fails after its retries fails the whole group the same way.

For experiments, :class:`RewardConfig` adds a delay per call and a failure probability per
attempt (decided by a seeded hash of sample id and attempt, so runs are reproducible).

A reward that can never succeed ends the run: :class:`RewardWatch` raises
:class:`RewardFailure` once ``give_up_groups`` groups in a row failed, or failures went on
for ``give_up_s`` seconds without a scored group, naming the source, the count and the last
error (verl and OpenRLHF stop on a failing reward model too; an endless run of dropped
groups learns nothing). A reward function is checked to take ``(prompt, response)`` before
any process starts.
"""

from __future__ import annotations

import inspect
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from nobubble.rl.system.imports import is_import_path, load_object
from nobubble.rl.system.tasks.spec import RewardError, TaskSpec, as_reward
from nobubble.rl.system.types import SampleGroup, Span
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
    :class:`RewardFailure` when the run should stop (see :class:`RewardConfig`). The
    streak's clock starts when its first group was admitted (``SampleGroup.t_admitted``,
    wall-clock), so a service that never answers is given up on ``give_up_s`` after the
    first request it left unanswered."""

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
    """One weighted term of the reward: ``weight * fn(prompt, response)``.

    ``fn`` is ``"task"`` (the task's reward), an import path, or a picklable callable.
    """

    fn: str | RewardFn = "task"
    weight: float = 1.0

    def __post_init__(self) -> None:
        if not finite(self.weight):
            raise ValueError(f"reward weight {self.weight} must be a finite number")
        if isinstance(self.fn, str):
            if self.fn != "task" and not is_import_path(self.fn):
                raise ValueError(
                    f"reward {self.fn!r} is neither 'task' nor an import path 'module:fn'"
                )
            if self.fn != "task":
                check_reward_fn(load_object(self.fn, "reward"), self.fn)
        else:
            check_reward_fn(self.fn, getattr(self.fn, "__name__", repr(self.fn)))

    def resolve(self, task: TaskSpec) -> RewardFn:
        if self.fn == "task":
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
        remote: a batched scorer ``(prompts, responses) -> (rewards, retries)``, or None.
        cfg: delays, injected failures, retries.
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

    def _attempt(self, sample_id: int, attempt: int, prompt: str, response: str) -> float:
        cfg = self.cfg
        if cfg.delay_s:
            time.sleep(cfg.delay_s)
        if (
            cfg.failure_rate
            and random.Random(hash((cfg.seed, sample_id, attempt))).random() < cfg.failure_rate
        ):
            raise InjectedRewardFailure(f"injected failure (sample {sample_id}, attempt {attempt})")
        return sum(w * as_reward(fn(prompt, response), name) for fn, w, name in self._fns)

    def score_group(self, group: SampleGroup) -> tuple[SampleGroup, Span]:
        """Score every sample of ``group``; returns the scored group and the busy span.

        A sample whose local reward raises on all ``1 + max_retries`` attempts gets
        ``reward=None`` and ``reward_error`` = the last error; a remote service that fails
        after its retries fails every sample of the group.
        """
        start = time.time()
        cfg = self.cfg
        values: list[float | None] = []
        errors: list[str | None] = []
        retries = 0
        for s in group.samples:
            error = None
            value: float | None = None
            for attempt in range(cfg.max_retries + 1):
                try:
                    value = self._attempt(s.sample_id, attempt, s.prompt, s.response)
                except Exception as err:  # noqa: BLE001 - any verifier failure is recorded
                    error = f"{type(err).__name__}: {err}"
                    retries += attempt < cfg.max_retries
                    continue
                break
            values.append(value)
            errors.append(
                None if value is not None else f"{error} (after {cfg.max_retries} retries)"
            )
        if self.remote is not None:
            try:
                remote, used = self.remote.score(
                    [s.prompt for s in group.samples], [s.response for s in group.samples]
                )
                retries += used
                values = [None if v is None else v + r for v, r in zip(values, remote)]
            except Exception as err:  # noqa: BLE001 - the service's failure is recorded
                values = [None] * len(values)
                errors = [e or f"{type(err).__name__}: {err}" for e in errors]
        now = time.time()
        out = tuple(
            s.scored(v, now) if v is not None else s.failed(str(e), now)
            for s, v, e in zip(group.samples, values, errors)
        )
        scored = group.with_samples(out)
        span = Span(
            "reward",
            f"reward g{group.group_id}",
            start,
            now,
            {
                "group": group.group_id,
                "retries": retries,
                "failed": sum(s.reward_failed for s in out),
            },
        )
        return scored, span
