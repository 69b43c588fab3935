"""The data that flows between the RL stages: :class:`Sample` (one response to one prompt)
and :class:`SampleGroup`. Legend: ``P`` prompt tokens (``<bos>`` included), ``N`` response tokens.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any

import torch

__all__ = ["Sample", "SampleGroup", "GroupRequest", "Span"]


@dataclass(frozen=True)
class Sample:
    """One generated response (``sample_id = group_id * group_size + index``, unique in a
    run). ``behaviour_logprobs`` are under the policy that sampled it, 0 past the mask; with
    partial rollouts ``policy_version`` is the version of its first token, the oldest of
    ``token_versions`` (None: every token is ``policy_version``)."""

    sample_id: int
    group_id: int
    prompt_id: int  # index in the task's enumerated prompt space
    prompt: str
    response: str  # decoded, up to the first <eos>
    tokens: torch.Tensor  # (P + N,) int64, prompt then response (padded after <eos>)
    response_mask: torch.Tensor  # (N,) bool, generated tokens up to and including <eos>
    behaviour_logprobs: torch.Tensor  # (N,) float32
    policy_version: int
    reward: float | None = None  # None until scored, or when the reward failed
    reward_error: str | None = None  # the reward's last error after its retries
    t_generated: float = 0.0  # time.time() when generated
    t_scored: float | None = None  # time.time() when scored (or failed)
    token_versions: torch.Tensor | None = None  # (N,) int64, non-decreasing

    @property
    def reward_failed(self) -> bool:
        return self.reward_error is not None

    def versions(self) -> torch.Tensor:
        """(N,) int64: the version behind each response token."""
        if self.token_versions is not None:
            return self.token_versions
        return torch.full(self.response_mask.shape, self.policy_version, dtype=torch.int64)

    def scored(self, reward: float, t: float) -> Sample:
        return replace(self, reward=float(reward), reward_error=None, t_scored=t)

    def failed(self, error: str, t: float) -> Sample:
        return replace(self, reward=None, reward_error=error, t_scored=t)


@dataclass(frozen=True)
class SampleGroup:
    """A GRPO group: the samples of one prompt, started by one policy version (ValueError at
    construction if they disagree on group, prompt or version; later tokens:
    :func:`~nobubble.rl.system.rollout.check_token_versions`)."""

    group_id: int
    prompt_id: int
    samples: tuple[Sample, ...]
    t_admitted: float = 0.0
    # (version, digest) of every weight version its tokens were sampled with (the generator's)
    weight_digests: tuple[tuple[int, str], ...] = ()
    generator: str = ""  # the rollout worker that sampled it ("rollout-0")

    def __post_init__(self) -> None:
        if not self.samples:
            raise ValueError(f"group {self.group_id} has no samples")
        versions = {s.policy_version for s in self.samples}
        if len(versions) != 1:
            raise ValueError(f"group {self.group_id} mixes policy versions {sorted(versions)}")
        if any(s.group_id != self.group_id or s.prompt_id != self.prompt_id for s in self.samples):
            raise ValueError(f"group {self.group_id}: a sample carries another group or prompt id")

    @property
    def policy_version(self) -> int:
        return self.samples[0].policy_version

    @cached_property
    def newest_version(self) -> int:
        """The newest version behind any response token of the group (= ``policy_version``
        with whole-group versioning). Cached: the buffer asks at every dispatch."""
        if all(s.token_versions is None for s in self.samples):
            return self.policy_version
        versions = torch.stack([s.versions() for s in self.samples])  # (G, N)
        mask = torch.stack([s.response_mask for s in self.samples])  # (G, N)
        return int(torch.where(mask, versions, self.policy_version).max())

    @property
    def sample_ids(self) -> tuple[int, ...]:
        return tuple(s.sample_id for s in self.samples)

    @property
    def reward_failed(self) -> bool:
        return any(s.reward_failed for s in self.samples)

    def with_samples(self, samples: tuple[Sample, ...]) -> SampleGroup:
        return replace(self, samples=samples)

    def __reduce__(self):
        # Pickle a group as a few stacked numpy arrays plus lists: pickling each sample's
        # small tensors one by one cost ~1 ms per sample, more than generating it.
        ss = self.samples
        packed: dict[str, Any] = {
            key: torch.stack([getattr(s, name) for s in ss]).numpy()
            for key, name in _PACKED_TENSORS.items()
        }
        packed["scalars"] = [tuple(getattr(s, name) for name in _PACKED_SCALARS) for s in ss]
        packed["versions"] = (
            None
            if all(s.token_versions is None for s in ss)
            else torch.stack([s.versions() for s in ss]).numpy()
        )
        packed["digests"] = (self.weight_digests, self.generator)
        return (_unpack_group, (self.group_id, self.prompt_id, self.t_admitted, packed))


# A packed group: the per-sample fields as one row per sample, the tensors stacked over the
# group under the keys they have always had (checkpoints hold packed groups).
_PACKED_SCALARS = (
    "sample_id", "prompt", "response", "policy_version", "reward", "reward_error",
    "t_generated", "t_scored",
)  # fmt: skip
_PACKED_TENSORS = {"tokens": "tokens", "mask": "response_mask", "logp": "behaviour_logprobs"}


def _unpack_group(group_id: int, prompt_id: int, t_admitted: float, packed: dict) -> SampleGroup:
    stacked: dict[str, Any] = {  # field -> (G, ...) tensor
        name: torch.from_numpy(packed[key].copy()) for key, name in _PACKED_TENSORS.items()
    }
    if packed.get("versions") is not None:
        stacked["token_versions"] = torch.from_numpy(packed["versions"].copy())
    samples = tuple(
        Sample(
            group_id=group_id,
            prompt_id=prompt_id,
            **dict(zip(_PACKED_SCALARS, row, strict=True)),
            **{name: rows[i] for name, rows in stacked.items()},
        )
        for i, row in enumerate(packed["scalars"])
    )
    digests, generator = packed.get("digests", ((), ""))
    return SampleGroup(group_id, prompt_id, samples, t_admitted, tuple(digests), generator)


@dataclass(frozen=True)
class GroupRequest:
    """An admitted group waiting to be generated: ``group_size`` responses to one prompt."""

    group_id: int
    prompt_id: int
    prompt: str
    t_admitted: float


@dataclass(frozen=True)
class Span:
    """A busy span of one stage worker, for the per-stage timeline (seconds, wall clock)."""

    stage: str
    name: str
    start_s: float
    end_s: float
    args: dict = field(default_factory=dict)
