"""The one experience buffer of both producers (admission, oldest-first batches, the
ledger of every sample's fate) and the task run's replay of past groups.

Every group moves ``ADMITTED -> GENERATED -> SCORED -> TRAINED`` or ends ``DROPPED`` for one
of :data:`DROP_REASONS`; a requeued group (a dead worker, a resume) goes back to
``ADMITTED`` under the same ids. Invariant: every generated sample gets exactly one fate,
trained once (plus its replay reuses) or dropped (``docs/rl/system.md``).
"""

from __future__ import annotations

import copy
import enum
import statistics
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Generic, Protocol, TypeVar

if TYPE_CHECKING:
    from nobubble.rl.system.config import ReplayConfig
    from nobubble.rl.system.types import SampleGroup

__all__ = [
    "GroupState",
    "LedgerError",
    "LedgerSummary",
    "ExperienceBuffer",
    "GroupReplay",
    "DROP_REASONS",
    "REQUEUE_REASONS",
]

DROP_REASONS = ("stale", "reward_failed", "unfinished", "synced")
REQUEUE_REASONS = ("worker_died", "resumed")


class LedgerError(ValueError):
    """A sample given a second fate, an illegal move, or a run whose samples are not all
    accounted for (a bug, never expected)."""


class Experience(Protocol):
    """What the buffer holds: a text group (:class:`~nobubble.rl.system.types.SampleGroup`)
    or an env producer's trajectory, each one ``policy_version`` old at its oldest."""

    @property
    def group_id(self) -> int: ...
    @property
    def sample_ids(self) -> tuple[int, ...]: ...
    @property
    def policy_version(self) -> int: ...
    @property
    def newest_version(self) -> int: ...
    @property
    def reward_failed(self) -> bool: ...


G = TypeVar("G", bound=Experience)


class GroupState(enum.Enum):
    ADMITTED = "admitted"
    GENERATED = "generated"
    SCORED = "scored"
    TRAINED = "trained"
    DROPPED = "dropped"


_NEXT = {
    GroupState.ADMITTED: {GroupState.GENERATED, GroupState.DROPPED},
    GroupState.GENERATED: {GroupState.SCORED, GroupState.DROPPED},
    GroupState.SCORED: {GroupState.TRAINED, GroupState.DROPPED},
    GroupState.TRAINED: set(),
    GroupState.DROPPED: set(),
}


@dataclass(frozen=True)
class LedgerSummary:
    """Counts of samples by fate; ``ok`` when every generated sample has exactly one fate."""

    generated: int
    trained: int
    dropped: dict[str, int]  # reason -> samples
    in_flight: int  # groups neither trained nor dropped
    requeued: int = 0  # groups sent back to generation (a dead worker, a resume)
    reused: int = 0  # sample trainings from the replay, beyond each sample's first
    by_learner: dict[int, int] = field(default_factory=dict)  # learner -> sample trainings
    gaps: tuple[str, ...] = ()  # sources whose numbered groups skip a number

    @property
    def ok(self) -> bool:
        whole = self.trained + sum(self.dropped.values()) == self.generated
        return self.in_flight == 0 and whole and not self.gaps

    def to_json(self) -> dict[str, object]:
        """Every field but ``in_flight`` (learner keys as strings), and ``ok``."""
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "in_flight"}
        by_learner = {str(k): v for k, v in self.by_learner.items()}
        return {**out, "by_learner": by_learner, "gaps": list(self.gaps), "ok": self.ok}


class ExperienceBuffer(Generic[G]):
    """Scored groups waiting for the trainer, the admission rule and the ledger of every
    group's state and every sample's fate (trained at step s, or dropped for a reason):
    ``batch_groups`` (B >= 1) groups per batch, a sample lags the trainer by at most
    ``max_staleness`` (>= 0) versions at admission and ``drop_staleness`` (None:
    ``max_staleness``) in the buffer; ``admit_on_arrival``: always admit (an env producer).
    Bookkeeping errors of the ledger are :class:`LedgerError`."""

    # what :meth:`state_dict` saves besides the ready groups: every attribute ``__init__``
    # sets is one of these or of SETTINGS (the constructor's; tests/rl/system/test_experience.py)
    CHECKPOINTED = (
        "_num_live", "_state", "_sample_ids", "fate", "requeues", "reuse", "learners", "sources",
    )  # fmt: skip
    SETTINGS = ("batch_groups", "max_staleness", "drop_staleness", "admit_on_arrival")

    def __init__(
        self,
        *,
        batch_groups: int,
        max_staleness: int,
        drop_staleness: int | None = None,
        admit_on_arrival: bool = False,
    ) -> None:
        if batch_groups < 1:
            raise ValueError(f"batch_groups={batch_groups} must be >= 1")
        if max_staleness < 0:
            raise ValueError(f"max_staleness={max_staleness} must be >= 0 (0 = synchronous)")
        if drop_staleness is not None and drop_staleness < 0:
            raise ValueError(f"drop_staleness={drop_staleness} must be >= 0")
        self.batch_groups = batch_groups
        self.max_staleness = max_staleness
        self.drop_staleness = max_staleness if drop_staleness is None else drop_staleness
        self.admit_on_arrival = admit_on_arrival
        self._num_live = 0  # groups started and not dropped: N_r before the next admission
        self._ready: dict[int, G] = {}
        self._state: dict[int, GroupState] = {}
        self._sample_ids: dict[int, tuple[int, ...]] = {}
        self.fate: dict[int, str] = {}  # sample id -> "trained@<step>" | "dropped:<reason>"
        self.requeues: list[tuple[int, str]] = []  # (group id, reason), in order
        self.reuse: dict[int, list[int]] = {}  # sample id -> steps it was trained again at
        # group id -> the learner of each training of it: the first, then every reuse
        self.learners: dict[int, list[int]] = {}
        self.sources: dict[str, list[int]] = {}  # source -> the numbers of its groups

    def can_admit(self, version: int, n: int = 1) -> bool:
        """May ``n`` more groups start (all or none) now that the trainer has published
        ``version``? The one rule (AReaL): the last, the ``N_r = num_live + n``-th, must keep
        ``floor((N_r - 1) / B) <= version + max_staleness``."""
        bound = (self._num_live + n - 1) // self.batch_groups <= version + self.max_staleness
        return self.admit_on_arrival or bound

    def admit(self, group_id: int, version: int, source: tuple[str, int] | None = None) -> None:
        """``group_id`` starts (or, admitted on arrival, has arrived) while the trainer's
        latest version is ``version``; ``source=(name, seq)``: the ``seq``-th group that
        ``name`` made (the gap check)."""
        if not self.can_admit(version):
            raise ValueError(
                f"group {group_id} refused: {self._num_live + 1} live groups exceed "
                f"batch {self.batch_groups} x (version {version} + max_staleness {self.max_staleness} + 1)"
            )
        if group_id in self._state:
            raise LedgerError(f"group {group_id} admitted twice")
        self._state[group_id] = GroupState.ADMITTED
        if source is not None:
            self.sources.setdefault(source[0], []).append(source[1])
        self._num_live += 1

    def move(self, group_id: int, new: GroupState, sample_ids: tuple[int, ...] = ()) -> None:
        old = self._state.get(group_id)
        if old is None:
            raise LedgerError(f"group {group_id} was never admitted")
        if new not in _NEXT[old]:
            raise LedgerError(f"group {group_id}: illegal transition {old.value} -> {new.value}")
        self._state[group_id] = new
        if sample_ids:
            self._sample_ids[group_id] = sample_ids

    def generated(self, group: G) -> None:
        self.move(group.group_id, GroupState.GENERATED, group.sample_ids)

    def put(self, group: G) -> None:
        """Add a scored group; one with a failed reward is dropped (``reward_failed``)."""
        self.move(group.group_id, GroupState.SCORED)
        if group.reward_failed:
            self.dropped(group.group_id, "reward_failed")
        else:
            self._ready[group.group_id] = group

    def dropped(self, group_id: int, reason: str) -> None:
        """Drop ``group_id`` (ready, or still in flight) for ``reason``."""
        if reason not in DROP_REASONS:
            raise LedgerError(f"drop reason {reason!r} is not a stated policy {DROP_REASONS}")
        self.move(group_id, GroupState.DROPPED)
        self._set_fate(self._sample_ids.get(group_id, ()), f"dropped:{reason}")
        self._ready.pop(group_id, None)
        self._num_live -= 1

    def take_batch(self, trainer_version: int, sync: bool = False) -> list[G] | None:
        """The B groups of the oldest policy versions (ties: the lower group id) fresh
        enough for ``trainer_version``, or None if too few. Groups past the staleness bound
        are dropped (``"stale"``); with ``sync`` (a forced full sync) every group older than
        ``trainer_version`` too (``"synced"``), so the batch is on-policy."""
        floor = trainer_version - self.drop_staleness
        # newest_version = policy_version unless partial rollouts continued the group with
        # newer weights; then its tokens within the bound still train (the rest are masked)
        for gid, grp in list(self._ready.items()):
            if grp.newest_version < floor:
                self.dropped(gid, "stale")
            elif sync and grp.policy_version < trainer_version:
                self.dropped(gid, "synced")
        if len(self._ready) < self.batch_groups:
            return None
        order = sorted(self._ready.values(), key=lambda g: (g.policy_version, g.group_id))
        batch = order[: self.batch_groups]
        for g in batch:
            del self._ready[g.group_id]
        return batch

    def mark_trained(
        self, batch: list[G], step: int, trained_by: dict[int, int] | None = None
    ) -> None:
        """``batch`` trained at ``step``; ``trained_by``: group id -> learner (None: 0)."""
        for g in batch:
            self.move(g.group_id, GroupState.TRAINED)
            self._set_fate(g.sample_ids, f"trained@{step}")
            self.learners[g.group_id] = [(trained_by or {}).get(g.group_id, 0)]

    def reused(self, group: Experience, step: int, learner: int = 0) -> None:
        """``group`` (already trained) was trained again at ``step``, from the replay, by
        learner ``learner``."""
        if self._state.get(group.group_id) is not GroupState.TRAINED:
            raise LedgerError(f"group {group.group_id} is reused but was never trained")
        for sid in group.sample_ids:
            self.reuse.setdefault(sid, []).append(step)
        self.learners.setdefault(group.group_id, []).append(learner)

    def requeue(self, group_id: int, reason: str) -> None:
        """Send an admitted or generated group (never a scored, trained or dropped one)
        back to ``ADMITTED``; it will be generated again under the same ids."""
        if reason not in REQUEUE_REASONS:
            raise LedgerError(f"requeue reason {reason!r} is not one of {REQUEUE_REASONS}")
        old = self._state.get(group_id)
        if old not in (GroupState.ADMITTED, GroupState.GENERATED):
            shown = None if old is None else old.value
            raise LedgerError(f"group {group_id} is {shown}; only groups in flight are requeued")
        self._state[group_id] = GroupState.ADMITTED
        self.requeues.append((group_id, reason))

    def close(self, unfinished: list[int]) -> None:
        """End of run: drop every group not trained (``"unfinished"``)."""
        for gid in [*unfinished, *self._ready]:
            self.dropped(gid, "unfinished")

    def states(self, group_ids: Iterable[int]) -> dict[str, int]:
        """How many of ``group_ids`` are in each state: ``{"admitted": 3, ...}``."""
        return dict(Counter(self._state[g].value for g in group_ids))

    def _set_fate(self, sample_ids: tuple[int, ...], fate: str) -> None:
        for sid in sample_ids:
            if sid in self.fate:
                raise LedgerError(f"sample {sid} already {self.fate[sid]}; cannot also be {fate}")
            self.fate[sid] = fate

    def summary(self) -> LedgerSummary:
        generated = sum(len(ids) for ids in self._sample_ids.values())
        fates = Counter(f.split("@")[0] for f in self.fate.values())  # "trained", "dropped:x"
        dropped = {r: fates.get(f"dropped:{r}", 0) for r in DROP_REASONS}
        in_flight = sum(bool(_NEXT[s]) for s in self._state.values())  # not final
        reused = sum(len(v) for v in self.reuse.values())
        by_learner: Counter[int] = Counter()
        for gid, learners in self.learners.items():
            for learner in learners:
                by_learner[learner] += len(self._sample_ids.get(gid, ()))
        return LedgerSummary(
            generated,
            fates.get("trained", 0),
            dropped,
            in_flight,
            len(self.requeues),
            reused,
            dict(sorted(by_learner.items())),
            tuple(s for s, seqs in self.sources.items() if sorted(seqs) != list(range(len(seqs)))),
        )

    def check(self) -> LedgerSummary:
        """The summary, after asserting that every sample has exactly one fate and no
        source has a gap (raises :class:`LedgerError`)."""
        summary = self.summary()
        if summary.in_flight:
            raise LedgerError(f"{summary.in_flight} groups neither trained nor dropped")
        if summary.gaps:
            raise LedgerError(f"sources {list(summary.gaps)} have gaps in their group numbers")
        if not summary.ok:
            raise LedgerError(f"samples unaccounted for: {summary}")
        return summary

    def state_dict(self) -> dict:
        """A copy of the live count and the ledger, and the ready groups as ``"ready"``
        (a checkpoint's part)."""
        state = {name: copy.deepcopy(getattr(self, name)) for name in self.CHECKPOINTED}
        return {**state, "ready": list(self._ready.values())}

    def load_state_dict(self, state: dict) -> None:
        for name in self.CHECKPOINTED:
            setattr(self, name, copy.deepcopy(state[name]))
        self._ready = {g.group_id: g for g in state["ready"]}


class GroupReplay:
    """A seeded ring of the last ``cfg.capacity`` trained groups, drawn again whole, without
    replacement, within the staleness bound: ``uniform`` (IS weight 1) or ``prioritized`` by
    the group's reward variance (:class:`~nobubble.rl.algo.replay.PrioritizedReplayBuffer`'s
    probabilities and IS weights over the eligible groups); it pickles into checkpoints."""

    def __init__(self, cfg: ReplayConfig, seed: int = 0, eps: float = 1e-6) -> None:
        from nobubble.rl.algo.replay import PrioritizedReplayBuffer

        alpha = cfg.alpha if cfg.mode == "prioritized" else 0.0
        self._buffer: PrioritizedReplayBuffer[SampleGroup] = PrioritizedReplayBuffer(
            max(1, cfg.capacity), alpha=alpha, eps=eps, seed=seed
        )

    def add(self, groups: list[SampleGroup]) -> None:
        rewards = [[s.reward or 0.0 for s in g.samples] for g in groups]
        self._buffer.extend(
            groups, [statistics.variance(r) if len(r) > 1 else 0.0 for r in rewards]
        )

    def sample(
        self, n: int, trainer_version: int, max_staleness: int, beta: float
    ) -> list[tuple[SampleGroup, float]]:
        """Up to ``n`` distinct groups with lag <= ``max_staleness``, with their IS weights."""
        if n < 1 or not len(self._buffer):
            return []
        floor = trainer_version - max_staleness
        drawn = self._buffer.sample(
            n, beta, eligible=lambda g: g.policy_version >= floor, replace=False
        )
        return list(zip(drawn.items, drawn.weights.tolist()))
