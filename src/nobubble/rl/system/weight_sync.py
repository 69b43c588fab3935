"""Versioned weights from the trainer to the generators, and the proof of each version
(``docs/rl/system.md``). Versions only increase: publishing a version not newer than the
last, or loading an older one, raises :class:`WeightVersionError`.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from typing import Any, Protocol

import torch
from torch import nn

from nobubble.distributed import WorkerError

__all__ = [
    "WeightVersionError",
    "WeightSource",
    "SharedWeights",
    "PublishedWeights",
    "weight_digest",
    "cached_digest",
]


class WeightVersionError(RuntimeError):
    """A weight version went backwards or repeated, or a sample's weights are not the
    version it claims."""


def weight_digest(model: Any) -> str:
    """16 hex digits of SHA-256 over ``model``'s state dict (an ``nn.Module``'s) as float32,
    in order: equal for two copies of the same weights (a version and a generator's load).
    SHA-256 (CPUs hash it in hardware: ~1.8x BLAKE2b's speed here), fed without a copy."""
    h = hashlib.sha256()
    for t in model.state_dict().values():
        h.update(t.detach().to(torch.float32).contiguous().cpu().numpy())
    return h.hexdigest()[:16]


def cached_digest(cache: dict[int, str], model: Any, version: int) -> tuple[int, str]:
    """``(version, digest)`` of ``model`` holding ``version``, hashed once per version."""
    if version not in cache:
        cache[version] = weight_digest(model)
    return version, cache[version]


class PublishedWeights:
    """The learner's record of each version it published: ``digests`` (version -> digest),
    from the digests each train step reports; :meth:`check_trained` checks samples' claims."""

    def __init__(self) -> None:
        self.digests: dict[int, str] = {}

    @property
    def versions(self) -> list[int]:
        """The published versions, oldest first."""
        return sorted(self.digests)

    def publish(self, digests: dict[int, str]) -> None:
        for version, digest in digests.items():
            known = self.digests.setdefault(version, digest)
            if known != digest:
                raise WeightVersionError(
                    f"version {version} was published twice with different weights "
                    f"({known} then {digest})"
                )

    def check_trained(
        self, samples: Iterable[tuple[str | None, str, Iterable[tuple[int, str]]]]
    ) -> None:
        """Raise a :class:`~nobubble.distributed.WorkerError` naming ``worker`` (that sampled
        it) and ``who`` on the first ``(version, digest)`` claim of a trained sample's
        ``(worker, who, claims)`` of a version never published or of other weights."""
        for worker, who, claims in samples:
            for version, digest in claims:
                known = self.digests.get(version)
                if known is None:
                    raise WorkerError(f"{who} claims version {version}, never published", worker)
                if known != digest:
                    raise WorkerError(
                        f"{who} sampled with weights {digest} as version {version}, but "
                        f"version {version} is {known}: a generator used weights other than "
                        "the version it reports",
                        worker,
                    )


class WeightSource(Protocol):
    """Where a stage worker gets published weights and publishes its own."""

    def pull(self, model: nn.Module, have: int) -> int:
        """Load the newest weights into ``model`` if newer than ``have``; the version it holds."""

    def publish(self, model: nn.Module, version: int) -> Any:
        """Publish ``model``'s weights as ``version``; the engine's handle to them (or None)."""


def check_newer(old: int, new: int, who: str) -> None:
    if new < old:
        raise WeightVersionError(f"{who}: weight version went back from {old} to {new}")


class SharedWeights:
    """The local engine's :class:`WeightSource`: a model's state dict as one flat float32
    tensor in shared memory with an increasing version (-1: nothing published yet), copied in
    and out under one lock. Create it in the parent (``SharedWeights(model, mp_context)``) and
    pass it to the worker processes."""

    def __init__(self, model: nn.Module, mp_context: Any) -> None:
        state = model.state_dict()
        self._shapes = {name: t.shape for name, t in state.items()}
        self._sizes = [t.numel() for t in state.values()]
        self._flat = torch.zeros(sum(self._sizes), dtype=torch.float32).share_memory_()
        self._version = mp_context.Value("q", -1, lock=False)
        self._lock = mp_context.Lock()

    @property
    def version(self) -> int:
        return int(self._version.value)

    def publish(self, model: nn.Module, version: int, timeout_s: float = 30.0) -> None:
        """Copy ``model``'s state in as ``version`` (must exceed the current version)."""
        flat = torch.cat([t.detach().reshape(-1).float() for t in model.state_dict().values()])
        if not self._lock.acquire(timeout=timeout_s):
            raise TimeoutError(f"SharedWeights.publish: lock not acquired in {timeout_s}s")
        try:
            if version <= self._version.value:
                raise WeightVersionError(
                    f"published version {version} is not newer than {self._version.value}"
                )
            self._flat.copy_(flat)
            self._version.value = version
        finally:
            self._lock.release()

    def pull(self, model: nn.Module, have: int, timeout_s: float = 30.0) -> int:
        """Load the published weights into ``model`` if newer than ``have``; the version it
        holds."""
        if self._version.value <= have:
            return have
        if not self._lock.acquire(timeout=timeout_s):
            raise TimeoutError(f"SharedWeights.pull: lock not acquired in {timeout_s}s")
        try:
            version = int(self._version.value)
            flat = self._flat.clone()
        finally:
            self._lock.release()
        check_newer(have, version, "SharedWeights.pull")
        parts = flat.split(self._sizes)  # one flat view per tensor, in state-dict order
        model.load_state_dict({n: t.view(s) for (n, s), t in zip(self._shapes.items(), parts)})
        return version
