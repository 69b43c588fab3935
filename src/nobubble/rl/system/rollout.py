"""The rollout stage: turn admitted group requests into sampled groups.

A :class:`RolloutWorker` owns a copy of the policy. ``generate`` samples ``group_size``
responses for every request with the weights it holds at the call; by default weights change
only between calls (``set_weights`` or a pull from shared memory), so every group is
generated whole by one policy version. With ``partial_rollouts`` the worker also takes new
weights between tokens (:mod:`~nobubble.rl.system.partial`): each sample then records the
version behind every token (``Sample.token_versions``), and its ``policy_version`` is the
version that started it. All requests of a call are sampled in one batch: on a CPU a batch
of 128 short sequences costs little more than one of 8.
"""

from __future__ import annotations

import time

import torch
from torch import nn

from nobubble.rl.system.config.run import RunConfig
from nobubble.rl.system.partial.inflight import InFlightWeights, WeightPull
from nobubble.rl.system.policies import sample
from nobubble.rl.system.tasks.spec import TaskSpec
from nobubble.rl.system.types import GroupRequest, Sample, SampleGroup, Span
from nobubble.rl.system.weight_sync import check_newer

__all__ = ["RolloutWorker"]


class RolloutWorker:
    """Samples groups with the policy version it holds (-1 until weights arrive).

    ``cfg`` is the run: the worker reads its stage's settings (``cfg.rollout``) and the ones
    the stages share (``group_size``, ``partial_rollouts``, ``weight_check_every``, the
    ``seed`` of its sampling, with ``worker_id``) there.
    With ``cfg.partial_rollouts``, :attr:`pull_weights` (``pull(model, have) -> version``,
    set by the engine) is asked for newer weights between tokens; :attr:`version` is then
    the version the worker holds after its last call.
    """

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

    def set_weights(self, version: int, state_dict: dict[str, torch.Tensor]) -> None:
        """Load ``state_dict`` as ``version``; the same version again is a no-op."""
        check_newer(self.version, version, f"rollout worker {self.worker_id}")
        if version != self.version:
            self.model.load_state_dict(state_dict)
            self.version = version

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
