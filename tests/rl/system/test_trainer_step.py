"""One trainer step, on a hand-built batch: its loss and gradient are the reference
formulas' (`tests/rl/algo/reference.py`, applied in ``trainer_reference``), and a few
steps move the policy the way each algorithm says."""

from __future__ import annotations

import copy
from dataclasses import replace

import pytest
import torch

from nobubble.rl.system.config import ALGOS, RunConfig, TrainerConfig
from nobubble.rl.system.learner import GroupBatch, Learner, group_learner
from nobubble.rl.system.rollout import RolloutWorker
from nobubble.rl.system.types import GroupRequest, SampleGroup
from tests.rl.system.trainer_reference import reference_loss, response_logprobs

# log(pi_behav) - log(pi) per token, cycled: ratios pi / pi_behav of e^2 (above the
# decoupled cap 5), 1.82, 1.28 (above 1 + clip), 1, 0.86, 0.67 (below 1 - clip) and 0.41
BEHAVIOUR_SHIFTS = (-2.0, -0.6, -0.25, 0.0, 0.15, 0.4, 0.9)
# the trainer's rewards, advantages and staleness weights are float32 (``Sample.reward`` is a
# float, ``GroupLoss`` builds them in float32); everything else is float64 on both sides
FLOAT32_INPUTS = {"rtol": 1e-6, "atol": 1e-9}


def _scored_groups(cfg: RunConfig, trainer: Learner) -> list[SampleGroup]:
    """Four groups sampled by the trainer's policy, scored 1 for a response that starts
    with "0" (independent of the task's reward)."""
    task = trainer.loss.task
    gen = RolloutWorker(task=task, model=cfg.build_policy(task), cfg=cfg)
    gen.model.load_state_dict(trainer.model.state_dict())
    gen.version = 0
    prompts = task.eval_prompts[:4]
    groups, _ = gen.generate([GroupRequest(i, i, p, 0.0) for i, p in enumerate(prompts)])
    return [
        g.with_samples(tuple(s.scored(float(s.response[:1] == "0"), 0.0) for s in g.samples))
        for g in groups
    ]


def _shift_behaviour(groups: list[SampleGroup]) -> list[SampleGroup]:
    """The batch as an older policy would have sampled it: every response token's behaviour
    log-prob moved by the next of :data:`BEHAVIOUR_SHIFTS`."""
    out, k = [], 0
    for g in groups:
        samples = []
        for s in g.samples:
            n = s.behaviour_logprobs.shape[0]
            shift = torch.tensor([BEHAVIOUR_SHIFTS[(k + t) % 7] for t in range(n)])
            k += n
            behav = s.behaviour_logprobs + shift * s.response_mask  # 0 stays 0 off the mask
            samples.append(replace(s, behaviour_logprobs=behav))
        out.append(g.with_samples(tuple(samples)))
    return out


@pytest.mark.parametrize("algo", ALGOS)
def test_each_step_has_the_reference_loss_and_gradient(algo):
    """3 steps on one off-policy batch (lags 0, 1, 2: staleness weights 1, 1/2, 1/3; the
    KL to the initial policy 0, then not), float64 policy: every step's loss and the
    gradient of every parameter equal the reference objective's, from the policy's own
    log-probs, before the optimizer moves the weights."""
    cfg = RunConfig(
        algo=algo,
        group_size=8,
        policy_kwargs={"hidden": 32},
        trainer=TrainerConfig(
            lr=1e-2,
            kl_coef=0.1,
            staleness_weighting="inverse",
            entropy_coef=0.01,
            uniform_kl_coef=0.05,
        ),  # fmt: skip
    )
    task = cfg.make_task()
    torch.manual_seed(0)
    model = cfg.build_policy(task).double()
    initial = copy.deepcopy(model)  # the KL reference: the initial policy, frozen
    trainer = group_learner(task=task, model=model, cfg=cfg)
    groups = _shift_behaviour(_scored_groups(cfg, trainer))
    rewards = [s.reward for g in groups for s in g.samples]
    assert 0.0 in rewards and 1.0 in rewards, "the batch needs both kinds of response"
    params = list(trainer.model.parameters())
    for version in range(3):
        got = trainer.compute_gradients(GroupBatch(groups))
        expected = reference_loss(model, groups, trainer.loss.run, task, version, kl_model=initial)
        expected_grads = torch.autograd.grad(expected, params, allow_unused=True)
        loss = torch.tensor(got.metrics["loss"], dtype=torch.float64)
        torch.testing.assert_close(loss, expected.detach(), **FLOAT32_INPUTS)
        for p, g in zip(params, expected_grads):
            got_grad = torch.zeros_like(p) if p.grad is None else p.grad
            want = torch.zeros_like(p) if g is None else g
            torch.testing.assert_close(got_grad, want, **FLOAT32_INPUTS)
        assert any(p.grad is not None and p.grad.abs().max() > 1e-4 for p in params)
        if algo in ("grpo", "ppo", "vtrace-ppo"):  # the batch reaches PPO's clip
            assert got.metrics["clip_fraction"] > 0  # (decoupled PPO's is this step's weights)
        trainer.update([GroupBatch(groups)])  # the same gradient, clipped, one Adam step
    assert trainer.version == 3


@pytest.mark.parametrize("algo", ["grpo", "ppo", "decoupled-ppo", "vtrace"])
def test_step_raises_logprob_of_better_responses(algo):
    cfg = RunConfig(
        algo=algo,
        group_size=16,
        policy_kwargs={"hidden": 32},
        trainer=TrainerConfig(lr=3e-3, uniform_kl_coef=0.0),
    )
    task = cfg.make_task()
    torch.manual_seed(0)
    trainer = group_learner(task=task, model=cfg.build_policy(task), cfg=cfg)
    gen = RolloutWorker(task=task, model=cfg.build_policy(task), cfg=cfg)
    gen.model.load_state_dict(trainer.model.state_dict())
    gen.version = 0
    prompts = task.eval_prompts[:4]
    groups, _ = gen.generate([GroupRequest(i, i, p, 0.0) for i, p in enumerate(prompts)])
    # reward: 1 for responses that start with "0", else 0 (independent of the task's reward)
    scored = [
        g.with_samples(tuple(s.scored(float(s.response[:1] == "0"), 0.0) for s in g.samples))
        for g in groups
    ]
    samples = [s for g in scored for s in g.samples]
    tokens = torch.stack([s.tokens for s in samples])
    good = torch.tensor([s.reward == 1.0 for s in samples])
    assert good.any() and (~good).any(), "the batch needs both kinds of response"
    before = response_logprobs(trainer.model, tokens, task.prompt_len)[:, 0].detach()
    for _ in range(3):
        trainer.update([GroupBatch(scored)])
    after = response_logprobs(trainer.model, tokens, task.prompt_len)[:, 0].detach()
    assert trainer.version == 3
    delta = after - before
    assert delta[good].mean() > delta[~good].mean()
