"""A generator's work between two decoding steps: its per-token delay, and new weights.

Lifecycle of one generation call: :meth:`InFlightWeights.begin` (the version the model
holds) -> :meth:`~InFlightWeights.before_token` for steps ``0, 1, ..`` (True when the
weights changed: the sampler then recomputes its KV cache from the whole prefix, so every
token's log-prob is exactly that of the version recorded for it) ->
:meth:`~InFlightWeights.step_versions`. The whole batch switches at once. Invariant: the
recorded versions never decrease; each version the model takes is hashed once
(:attr:`~InFlightWeights.digests`): what the generator's samples claim.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch
from torch import nn

from nobubble.rl.system.weight_sync import check_newer, weight_digest

__all__ = ["WeightPull", "InFlightWeights"]

WeightPull = Callable[[nn.Module, int], int]


class InFlightWeights:
    """Per-token delay and in-flight weight updates for one generator's ``model``, the
    sampler's ``before_token`` hook.

    Args:
        model: the generator's policy; ``pull`` (``pull(model, have) -> version``, set by
            the engine) loads the newest published weights into it when newer than ``have``.
        partial: take new weights between tokens (partial rollouts); False = only sleep.
        every_tokens: with ``partial``, ask for new weights before every this many steps.
        token_delay_s: seconds to sleep before each decoding step.
    """

    def __init__(
        self, model: nn.Module, *, partial: bool, every_tokens: int = 1, token_delay_s: float = 0.0
    ) -> None:
        if every_tokens < 1:
            raise ValueError(f"every_tokens={every_tokens} must be >= 1 (1 = every token)")
        self.model = model
        self.partial = partial
        self.every_tokens = every_tokens
        self.token_delay_s = token_delay_s
        self.pull: WeightPull | None = None
        self.version = -1
        self._steps: list[int] = []
        self.digests: dict[int, str] = {}  # version -> digest of the weights the model held

    @property
    def active(self) -> bool:
        """Whether the sampler needs the hook at all."""
        return self.partial or self.token_delay_s > 0

    def begin(self, version: int) -> None:
        """A generation call starts with the model at ``version``."""
        if self.partial and self.pull is None:
            raise RuntimeError(
                "partial rollouts need a weight source between tokens (set "
                "RolloutWorker.pull_weights; the local engine sets it to its shared weights)"
            )
        self.version = version
        self._steps = []
        self._note()

    def _note(self) -> None:
        if self.version not in self.digests:
            self.digests[self.version] = weight_digest(self.model)

    def claims(self, versions: torch.Tensor) -> tuple[tuple[int, str], ...]:
        """``(version, digest)`` for each distinct version in ``versions``."""
        return tuple((v, self.digests[v]) for v in sorted(set(versions.tolist())))

    def before_token(self, step: int) -> bool:
        """Called before decoding step ``step``; True when the model's weights changed.

        The weights are fixed first, then the step's delay is slept: the delay stands for
        the step's own compute, done with the weights it starts with."""
        changed = False
        if self.partial and step % self.every_tokens == 0:
            assert self.pull is not None  # checked by begin()
            new = self.pull(self.model, self.version)
            check_newer(self.version, new, "in-flight weight update")
            changed = new != self.version
            self.version = new
            if changed:
                self._note()
        self._steps.append(self.version)
        if self.token_delay_s:
            time.sleep(self.token_delay_s)
        return changed

    def step_versions(self, num_tokens: int) -> torch.Tensor:
        """(num_tokens,) int64: the version each decoding step ran under; steps that never
        ran (every response stopped early) repeat the last version."""
        steps = self._steps[:num_tokens] or [self.version]
        steps = steps + [steps[-1]] * (num_tokens - len(steps))
        return torch.tensor(steps, dtype=torch.int64)
