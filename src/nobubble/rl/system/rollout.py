"""The rollout stage: a :class:`RolloutWorker` turns admitted requests into sampled groups.

It samples every request of a call in one batch with the weights it holds at the call, so a
group is generated whole by one version; with ``partial_rollouts`` it also takes newer weights
between tokens (:mod:`~nobubble.rl.system.partial`) and each sample records the version behind
every token (``Sample.token_versions``), its ``policy_version`` being the one that started it.
"""

from __future__ import annotations

import time

import torch
from torch import nn

from nobubble.rl.system.config import RunConfig
from nobubble.rl.system.partial.inflight import InFlightWeights, WeightPull
from nobubble.rl.system.policies import sample
from nobubble.rl.system.tasks import TaskSpec
from nobubble.rl.system.types import GroupRequest, Sample, SampleGroup, Span

__all__ = ["RolloutWorker"]


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

    @property
    def pull_weights(self) -> WeightPull | None:
        """The weight source between tokens (partial rollouts); None until the engine sets it."""
        return self.inflight.pull

    @pull_weights.setter
    def pull_weights(self, pull: WeightPull | None) -> None:
        self.inflight.pull = pull

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
        start = time.time()
        g = self.run.group_size
        prompts = [r.prompt for r in requests for _ in range(g)]
        ids, mask = self.task.encode(prompts)
        hook = self.inflight
        hook.begin(self.version)
        gen = sample(
            self.model,
            ids,
            max_new_tokens=self.task.max_new_tokens,
            eos_id=self.task.tokenizer.eos_id,
            pad_id=self.task.tokenizer.pad_id,
            temperature=self.cfg.temperature,
            generator=self.generator,
            budgets=self.task.budgets(prompts),
            attention_mask=mask,
            before_token=hook.before_token if hook.active else None,
        )
        first, self.version = self.version, hook.version
        steps = hook.step_versions(self.task.max_new_tokens)  # (N,) the version of each step
        if self.run.partial_rollouts:
            first = int(steps[0])
        claims = hook.claims(steps if self.run.partial_rollouts else torch.tensor([first]))
        if self.cfg.delay_s:
            time.sleep(self.cfg.delay_s)
        now = time.time()
        p = self.task.prompt_len
        groups = []
        for j, req in enumerate(requests):
            samples = []
            for i in range(g):
                row = j * g + i
                samples.append(
                    Sample(
                        sample_id=req.group_id * g + i,
                        group_id=req.group_id,
                        prompt_id=req.prompt_id,
                        prompt=req.prompt,
                        response=self.task.decode(gen.tokens[row, p:].tolist()),
                        tokens=gen.tokens[row].clone(),
                        response_mask=gen.response_mask[row].clone(),
                        behaviour_logprobs=gen.logprobs[row].clone(),
                        policy_version=first,
                        t_generated=now,
                        token_versions=steps.clone() if self.run.partial_rollouts else None,
                    )
                )
            groups.append(
                SampleGroup(
                    req.group_id,
                    req.prompt_id,
                    tuple(samples),
                    req.t_admitted,
                    claims,
                    f"rollout-{self.worker_id}",
                )  # fmt: skip
            )
        versions = f"v{first}" if self.version == first else f"v{first}-v{self.version}"
        span = Span(
            "rollout",
            f"gen {versions} x{len(requests)}",
            start,
            now,
            {"version": first, "last": self.version, "groups": [r.group_id for r in requests]},
        )
        return groups, span
