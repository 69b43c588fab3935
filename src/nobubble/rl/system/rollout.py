"""The rollout stage: a :class:`RolloutWorker` samples every request of a call in one batch
with the weights it holds, so a group is generated whole by one version; with
``partial_rollouts`` (``docs/rl/system.md``) it also takes newer weights between tokens
(:class:`InFlightWeights`) and records each token's version (``Sample.token_versions``).
Legend: ``B`` responses, ``N`` response tokens.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Sequence
from itertools import product
from typing import Any

import torch
from torch import nn

from nobubble.rl.algo.staleness import policy_lag
from nobubble.rl.system.config import RunConfig
from nobubble.rl.system.policies import Generation, sample
from nobubble.rl.system.tasks import TaskSpec
from nobubble.rl.system.types import GroupRequest, Sample, SampleGroup, Span
from nobubble.rl.system.weight_sync import check_newer, weight_digest

__all__ = [
    "RolloutWorker",
    "InFlightWeights",
    "sample_responses",
    "response_versions",
    "check_token_versions",
    "token_lag",
    "lag_histogram",
]


class InFlightWeights:
    """The sampler's ``before_token`` hook for one generator's ``model``: with ``partial``,
    ``pull(model, have) -> version`` (set by the engine) before every ``every_tokens``-th step
    loads newer weights; ``token_delay_s`` is slept each step. Lifecycle of a call:
    :meth:`begin` -> :meth:`before_token` for steps ``0, 1, ..`` (True when the weights changed)
    -> :meth:`step_versions`; the whole batch switches at once. Invariant: recorded versions
    never decrease; each version is hashed once (:attr:`digests`: what the samples claim).
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
        self.pull: Callable[[nn.Module, int], int] | None = None
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
                "RolloutWorker.inflight.pull; the local engine sets it to its shared weights)"
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
        """Called before decoding step ``step``; True when the model's weights changed. The
        delay is slept after the pull: it stands for the step's compute on those weights."""
        changed = False
        if self.partial and step % self.every_tokens == 0:
            assert self.pull is not None  # checked by begin()
            new = self.pull(self.model, self.version)
            check_newer(self.version, new, "in-flight weight update")
            changed, self.version = new != self.version, new
            self._note()  # hashes a version once
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


def response_versions(samples: Sequence[Sample]) -> torch.Tensor:
    """(B, N) int64: the version behind each response token of each sample."""
    return torch.stack([s.versions() for s in samples])


def check_token_versions(groups: Sequence[SampleGroup], *, partial: bool) -> None:
    """Raise ValueError unless every group keeps its mode's versioning rule: every token is
    the group's version (``partial=False``), or each response starts at the group's version
    and its versions never decrease (``partial=True``)."""
    for g in groups:
        for s in g.samples:
            if s.versions().shape != s.response_mask.shape:
                raise ValueError(
                    f"sample {s.sample_id}: token_versions of shape "
                    f"{tuple(s.versions().shape)} for {tuple(s.response_mask.shape)} tokens"
                )
        v = response_versions(g.samples)  # (G, N)
        back = (v[:, 1:] < v[:, :-1]).any(1)  # (G,) a response whose versions go back
        if not partial and bool((v != g.policy_version).any()):
            raise ValueError(
                f"group {g.group_id} has tokens of versions {sorted(set(v.flatten().tolist()))}"
                f", not only {g.policy_version}; whole-group versioning is the default "
                "mode's rule (a generator swaps weights between groups); set "
                "RunConfig.partial_rollouts=True to trade it for fresher tokens"
            )
        if partial and bool((v[:, 0] != g.policy_version).any()):
            raise ValueError(
                f"group {g.group_id}: a response starts at versions {v[:, 0].unique().tolist()}, "
                f"the group at {g.policy_version}"
            )
        if partial and bool(back.any()):
            bad = int(back.nonzero()[0])
            raise ValueError(
                f"sample {g.samples[bad].sample_id}: token versions {v[bad].tolist()} go "
                "back; weights only move forward"
            )


def token_lag(versions: torch.Tensor, trainer_version: int) -> torch.Tensor:
    """(B, N) int64 ``trainer_version - versions``; ValueError if a token is newer than the
    trainer (see :func:`~nobubble.rl.algo.staleness.policy_lag`)."""
    return policy_lag(versions.reshape(-1), trainer_version).view(versions.shape)


def lag_histogram(lag: torch.Tensor, mask: torch.Tensor) -> dict[int, int]:
    """Response tokens by staleness: ``{lag: count}`` over the tokens where ``mask`` (B, N)
    is set."""
    counts = Counter(lag[mask.bool()].tolist())
    return {int(k): int(n) for k, n in sorted(counts.items())}


def sample_responses(
    task: TaskSpec, model: nn.Module, prompts: list[str], **options: Any
) -> tuple[Generation, list[str]]:
    """:func:`~nobubble.rl.system.policies.sample` ``model`` on ``prompts`` with ``task``'s
    tokenizer and length budgets (``options``: more of its keywords); returns the generation
    and the decoded responses."""
    ids, mask = task.encode(prompts)
    gen = sample(
        model,
        ids,
        max_new_tokens=task.max_new_tokens,
        eos_id=task.tokenizer.eos_id,
        pad_id=task.tokenizer.pad_id,
        budgets=task.budgets(prompts),
        attention_mask=mask,
        **options,
    )
    return gen, [task.decode(row[task.prompt_len :].tolist()) for row in gen.tokens]


class RolloutWorker:
    """Samples groups with the policy version it holds (:attr:`version`; -1 until the engine
    loads weights), with ``cfg.rollout``'s settings and the run's ``group_size``,
    ``partial_rollouts``, ``weight_check_every`` and ``seed`` (with ``worker_id``)."""

    def __init__(
        self, *, task: TaskSpec, model: nn.Module, cfg: RunConfig, worker_id: int = 0
    ) -> None:
        self.task = task
        self.run, self.cfg = cfg, cfg.rollout
        self.worker_id = worker_id
        self.model = model.eval()
        self.version = -1
        self.stale_weights: dict[str, torch.Tensor] | None = None  # test hook, see go_stale
        self.generator = torch.Generator().manual_seed(10_000 * cfg.seed + worker_id)
        self.inflight = InFlightWeights(
            self.model,
            partial=cfg.partial_rollouts,
            every_tokens=cfg.weight_check_every,
            token_delay_s=self.cfg.token_delay_s,
        )

    def go_stale(self) -> None:
        """Test hook: from now on sample with the weights held now, whatever version the
        worker reports (the bug that weight digests catch)."""
        self.stale_weights = {k: v.clone() for k, v in self.model.state_dict().items()}

    def generate(self, requests: list[GroupRequest]) -> tuple[list[SampleGroup], Span]:
        """Sample every request's group; returns the groups and the busy span."""
        if self.version < 0:
            raise RuntimeError(f"rollout worker {self.worker_id}: no weights loaded yet")
        if self.stale_weights is not None:
            self.model.load_state_dict(self.stale_weights)
        start, g, partial = time.time(), self.run.group_size, self.run.partial_rollouts
        hook = self.inflight
        hook.begin(self.version)
        gen, responses = sample_responses(
            self.task,
            self.model,
            [r.prompt for r in requests for _ in range(g)],
            temperature=self.cfg.temperature,
            generator=self.generator,
            before_token=hook.before_token if hook.active else None,
        )
        steps = hook.step_versions(self.task.max_new_tokens)  # (N,) the version of each step
        first = int(steps[0]) if partial else self.version
        self.version = hook.version
        claims = hook.claims(steps if partial else torch.tensor([first]))
        if self.cfg.delay_s:
            time.sleep(self.cfg.delay_s)
        now = time.time()
        samples = [
            Sample(
                sample_id=req.group_id * g + i,
                group_id=req.group_id,
                prompt_id=req.prompt_id,
                prompt=req.prompt,
                response=responses[row],
                tokens=gen.tokens[row].clone(),
                response_mask=gen.response_mask[row].clone(),
                behaviour_logprobs=gen.logprobs[row].clone(),
                policy_version=first,
                t_generated=now,
                token_versions=steps.clone() if partial else None,
            )
            for row, (req, i) in enumerate(product(requests, range(g)))
        ]
        groups = [
            SampleGroup(
                req.group_id,
                req.prompt_id,
                tuple(samples[j * g : (j + 1) * g]),
                req.t_admitted,
                claims,
                f"rollout-{self.worker_id}",
            )
            for j, req in enumerate(requests)
        ]
        versions = f"v{first}" if self.version == first else f"v{first}-v{self.version}"
        ids = [r.group_id for r in requests]
        args = {"version": first, "last": self.version, "groups": ids}
        return groups, Span("rollout", f"gen {versions} x{len(requests)}", start, now, args)
