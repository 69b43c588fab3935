"""One trainer step moves the policy the way each algorithm says, on a hand-built batch."""

from __future__ import annotations

import pytest
import torch

from nobubble.rl.system.config import RunConfig
from nobubble.rl.system.policies import response_logprobs
from nobubble.rl.system.rollout import RolloutWorker
from nobubble.rl.system.trainer import Trainer
from nobubble.rl.system.types import GroupRequest


@pytest.mark.parametrize("algo", ["grpo", "ppo", "decoupled-ppo", "vtrace"])
def test_step_raises_logprob_of_better_responses(algo):
    cfg = RunConfig(
        algo=algo,
        group_size=16,
        policy_kwargs={"hidden": 32},
        trainer={"lr": 3e-3, "uniform_kl_coef": 0.0},
    )
    task = cfg.make_task()
    torch.manual_seed(0)
    trainer = Trainer(task=task, model=cfg.build_policy(task), cfg=cfg.trainer_config())
    gen = RolloutWorker(task=task, model=cfg.build_policy(task), cfg=cfg.rollout_config(), seed=0)
    gen.set_weights(0, trainer.state_dict())
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
        res = trainer.train_step(scored)
    after = response_logprobs(trainer.model, tokens, task.prompt_len)[:, 0].detach()
    assert res.version == 3
    delta = after - before
    assert delta[good].mean() > delta[~good].mean()
