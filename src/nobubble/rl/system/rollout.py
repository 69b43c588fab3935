"""The rollout stage: a :class:`RolloutWorker` samples every request of a call in one batch
with the weights it holds, so a group is generated whole by one version; with
``partial_rollouts`` (``docs/rl/system.md``) it also takes newer weights between tokens
(:meth:`RolloutWorker.before_token`) and records each token's version (``Sample.token_versions``).
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
from nobubble.rl.system.weight_sync import cached_digest, check_newer

__all__ = [
    "RolloutWorker",
    "sample_responses",
    "response_versions",
    "check_token_versions",
    "token_lag",
    "lag_histogram",
]


def response_versions(samples: Sequence[Sample]) -> torch.Tensor:
    """(B, N) int64: the version behind each response token of each sample."""
    if all(s.token_versions is None for s in samples):  # one version per row: no per-sample fill
        rows = torch.tensor([s.policy_version for s in samples], dtype=torch.int64)  # (B,)
        return rows[:, None].expand(-1, samples[0].response_mask.shape[0])  # (B, N)
    return torch.stack([s.versions() for s in samples])


def check_token_versions(groups: Sequence[SampleGroup], *, partial: bool) -> None:
    """Raise ValueError unless every group keeps its mode's versioning rule: every token is
    the group's version (``partial=False``), or each response starts at the group's version
    and its versions never decrease (``partial=True``)."""
    for g in groups:
        if all(s.token_versions is None for s in g.samples):
            continue  # every token is the sample's version, the group's (SampleGroup checks)
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
    ``partial_rollouts``, ``weight_check_every`` and ``seed`` (with ``worker_id``).
    :meth:`before_token`, the sampler's hook, loads newer weights through :attr:`pull`
    (``pull(model, have) -> version``, set by the engine) for the whole batch at once.
    Invariant: a call's step versions never decrease; each version the model takes is hashed
    once (:attr:`digests`: what the samples claim)."""

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
        self.pull: Callable[[nn.Module, int], int] | None = None
        self.digests: dict[int, str] = {}  # version -> digest of the weights the model held
        self._steps: list[int] = []  # the version of each decoding step of this call

    def go_stale(self) -> None:
        """Test hook: from now on sample with the weights held now, whatever version the
        worker reports (the bug that weight digests catch)."""
        self.stale_weights = {k: v.clone() for k, v in self.model.state_dict().items()}

    def before_token(self, step: int) -> bool:
        """Called before decoding step ``step``: with partial rollouts, every
        ``weight_check_every`` steps, pull; then sleep ``token_delay_s`` (the step's compute
        on those weights). True when the weights changed (the sampler recomputes its cache)."""
        changed = False
        if self.run.partial_rollouts and step % self.run.weight_check_every == 0:
            assert self.pull is not None  # checked by generate()
            new = self.pull(self.model, self.version)
            check_newer(self.version, new, "in-flight weight update")
            changed, self.version = new != self.version, new
            cached_digest(self.digests, self.model, new)
        self._steps.append(self.version)
        if self.cfg.token_delay_s:
            time.sleep(self.cfg.token_delay_s)
        return changed

    def generate(self, requests: list[GroupRequest]) -> tuple[list[SampleGroup], Span]:
        """Sample every request's group; returns the groups and the busy span."""
        if self.version < 0:
            raise RuntimeError(f"rollout worker {self.worker_id}: no weights loaded yet")
        partial, g, n = self.run.partial_rollouts, self.run.group_size, self.task.max_new_tokens
        if partial and self.pull is None:
            raise RuntimeError(
                "partial rollouts need a weight source between tokens (set "
                "RolloutWorker.pull; the engines set it to the call's weight source)"
            )
        if self.stale_weights is not None:
            self.model.load_state_dict(self.stale_weights)
        start, self._steps = time.time(), []
        cached_digest(self.digests, self.model, self.version)
        gen, responses = sample_responses(
            self.task,
            self.model,
            [r.prompt for r in requests for _ in range(g)],
            temperature=self.cfg.temperature,
            generator=self.generator,
            before_token=self.before_token if partial or self.cfg.token_delay_s else None,
        )
        # (N,) the version of each step; steps that never ran (all responses ended) repeat the last
        ran = self._steps[:n] or [self.version]
        steps = torch.tensor(ran + [ran[-1]] * (n - len(ran)), dtype=torch.int64)
        first = int(steps[0])
        claims = tuple((v, self.digests[v]) for v in sorted(set(steps.tolist())))
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
