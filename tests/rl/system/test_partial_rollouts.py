"""Partial rollouts: weights taken between tokens, per-token versions, per-token staleness.

The reference for "the later tokens really came from the newer weights" is a recomputation:
each response token's log-prob under the version recorded for it must equal the behaviour
log-prob the generator stored, and must differ from what the older weights give it. The
versions come from a fake weight source that publishes version ``i`` before decoding step
``i``, so every response carries the schedule ``0, 1, 2``.
"""

from __future__ import annotations

import pickle
from dataclasses import replace

import pytest
import torch

from nobubble.rl.algo.losses import grpo_advantages, ppo_policy_loss
from nobubble.rl.system.config import RewardConfig, RolloutConfig, RunConfig, TrainerConfig
from nobubble.rl.system.experience import ExperienceBuffer
from nobubble.rl.system.learner import GroupBatch, group_learner
from nobubble.rl.system.orchestrator import run
from nobubble.rl.system.policies import prompt_attention_mask
from nobubble.rl.system.rollout import RolloutWorker, check_token_versions
from nobubble.rl.system.types import GroupRequest, SampleGroup
from nobubble.rl.system.weight_sync import WeightVersionError
from tests.rl.system.trainer_reference import response_logprobs

SMALL = {"hidden": 32}


class StepPublisher:
    """A weight source that has published version ``min(i, last)`` before decoding step
    ``i`` of every generation call (``reset`` before each call)."""

    def __init__(self, models: list[torch.nn.Module]) -> None:
        self.models = models
        self.calls = 0

    def reset(self) -> None:
        self.calls = 0

    def pull(self, model: torch.nn.Module, have: int) -> int:
        version = min(self.calls, len(self.models) - 1)
        self.calls += 1
        if version > have:
            model.load_state_dict(self.models[version].state_dict())
        return max(version, have)


def _policies(cfg: RunConfig, n: int) -> list[torch.nn.Module]:
    """``n`` policies with far-apart random weights (std 0.3), so versions disagree."""
    task = cfg.make_task()
    out = []
    for k in range(n):
        model = cfg.build_policy(task).eval()
        gen = torch.Generator().manual_seed(100 + k)
        with torch.no_grad():
            for p in model.parameters():
                p.copy_(torch.randn(p.shape, generator=gen) * 0.3)
        out.append(model)
    return out


def _generate(cfg: RunConfig, models: list[torch.nn.Module], num_groups: int = 3):
    task = cfg.make_task()
    worker = RolloutWorker(task=task, model=cfg.build_policy(task), cfg=cfg)
    worker.model.load_state_dict(models[0].state_dict())
    worker.version = 0
    publisher = StepPublisher(models)
    worker.pull = publisher.pull
    reqs = [GroupRequest(i, i, task.prompts[i], 0.0) for i in range(num_groups)]
    groups, span = worker.generate(reqs)
    return task, worker, groups, span


@pytest.mark.parametrize("policy", ["char", "gpt2"])  # gpt2: a KV cache to recompute
def test_an_update_mid_response_changes_the_policy_of_the_later_tokens(policy):
    cfg = RunConfig(policy=policy, policy_kwargs=SMALL, group_size=8, partial_rollouts=True)
    models = _policies(cfg, 3)
    task, worker, groups, span = _generate(cfg, models)
    samples = [s for g in groups for s in g.samples]
    versions = torch.stack([s.token_versions for s in samples])  # (B, N)
    mask = torch.stack([s.response_mask for s in samples])  # (B, N)
    assert versions.tolist() == [[0, 1, 2]] * len(samples)  # recorded per token, monotone
    assert all(s.policy_version == 0 for s in samples) and worker.version == 2
    assert span.args["last"] == 2  # two in-flight updates: [0, 1, 2] above
    assert mask[:, 1:].any(), "some response must reach the tokens after the update"
    tokens = torch.stack([s.tokens for s in samples])  # (B, P + N)
    behav = torch.stack([s.behaviour_logprobs for s in samples])  # (B, N)
    attn = prompt_attention_mask(tokens, task.prompt_len, task.tokenizer.pad_id)
    with torch.no_grad():
        recomputed = [
            response_logprobs(m, tokens, task.prompt_len, attention_mask=attn) for m in models
        ]  # each (B, N)
    for v, logp in enumerate(recomputed):
        mine = mask & (versions == v)
        torch.testing.assert_close(behav[mine], logp[mine], atol=1e-4, rtol=0)
    later = mask & (versions > 0)
    assert (behav[later] - recomputed[0][later]).abs().max() > 0.1  # not version 0's


def test_whole_group_mode_never_pulls_between_tokens():
    cfg = RunConfig(policy_kwargs=SMALL, group_size=4)
    models = _policies(cfg, 3)
    _, worker, groups, _ = _generate(cfg, models)
    assert all(
        s.token_versions is None and s.policy_version == 0 for g in groups for s in g.samples
    )
    assert worker.version == 0  # no in-flight update: no token_versions above
    check_token_versions(groups, partial=False)


def test_versions_only_move_forward_between_tokens():
    cfg = RunConfig(policy_kwargs=SMALL, group_size=4, partial_rollouts=True)
    task = cfg.make_task()
    worker = RolloutWorker(task=task, model=cfg.build_policy(task), cfg=cfg)
    worker.version = 3
    request = [GroupRequest(0, 0, task.prompts[0], 0.0)]
    with pytest.raises(RuntimeError, match="weight source"):
        worker.generate(request)
    worker.pull = lambda model, have: have - 1
    with pytest.raises(WeightVersionError, match="went back from 3 to 2"):
        worker.generate(request)
    every2 = replace(cfg, weight_check_every=2)  # pulls before steps 0 and 2 only
    _, _, groups, _ = _generate(every2, _policies(every2, 3))
    assert {tuple(s.token_versions.tolist()) for g in groups for s in g.samples} == {(0, 0, 1)}


def test_decoding_steps_that_never_ran_repeat_the_last_version():
    """Version 0 never says <eos>, versions 1 and 2 always do: every response ends at step 1
    of 3, so step 2 never runs and takes step 1's version."""
    cfg = RunConfig(policy_kwargs=SMALL, group_size=4, partial_rollouts=True)
    models = _policies(cfg, 3)
    eos = cfg.make_task().tokenizer.eos_id
    with torch.no_grad():
        for k, model in enumerate(models):
            model.lm_head.bias[eos] = -50.0 if k == 0 else 50.0
    task, worker, groups, _ = _generate(cfg, models)
    assert task.max_new_tokens == 3
    samples = [s for g in groups for s in g.samples]
    assert {tuple(s.token_versions.tolist()) for s in samples} == {(0, 1, 1)}
    assert not any(bool(s.response_mask[2]) for s in samples)  # step 2 never ran
    assert worker.version == 1


def _scored(groups: list[SampleGroup]) -> list[SampleGroup]:
    """Reward 1 for responses that start with "0" (both kinds occur under random weights)."""
    return [
        g.with_samples(tuple(s.scored(float(s.response[:1] == "0"), 0.0) for s in g.samples))
        for g in groups
    ]


def test_losses_use_each_tokens_staleness_and_behaviour_logprob():
    """Versions 0, 1, 2 trained at version 2: lags 2, 1, 0. With drop K = 1 and inverse
    weights, the first token is out of the loss and the second counts half - against a
    loss built by hand from that schedule."""
    cfg = RunConfig(policy_kwargs=SMALL, group_size=8, partial_rollouts=True)
    task, _, groups, _ = _generate(cfg, _policies(cfg, 3))
    groups = _scored(groups)
    tcfg = replace(
        cfg, mode="fully-async", drop_staleness=1,
        trainer=TrainerConfig(uniform_kl_coef=0.0, staleness_weighting="inverse"),
    )  # fmt: skip
    assert tcfg.token_drop_staleness == 1
    torch.manual_seed(0)
    trainer = group_learner(task=task, model=cfg.build_policy(task), cfg=tcfg)
    trainer.version = 2
    grads = trainer.compute_gradients(GroupBatch(groups))
    got = {n: p.grad.clone() for n, p in trainer.model.named_parameters() if p.grad is not None}

    samples = [s for g in groups for s in g.samples]
    mask = torch.stack([s.response_mask for s in samples]).float()  # (B, N)
    keep = mask * torch.tensor([0.0, 1.0, 1.0])  # lag 2 > K: dropped
    w = torch.tensor([1 / 3, 1 / 2, 1.0])  # 1 / (1 + lag), lags 2, 1, 0
    assert grads.token_staleness == {0: int(mask[:, 2].sum()), 1: int(mask[:, 1].sum())}
    assert grads.num_tokens == int(keep.sum()) and grads.staleness == [2, 2, 2]
    tokens = torch.stack([s.tokens for s in samples])
    behav = torch.stack([s.behaviour_logprobs for s in samples])
    rewards = torch.tensor([s.reward for s in samples])
    attn = prompt_attention_mask(tokens, task.prompt_len, task.tokenizer.pad_id)
    trainer.model.zero_grad(set_to_none=True)
    logp = response_logprobs(trainer.model, tokens, task.prompt_len, attention_mask=attn)
    adv = grpo_advantages(rewards, 8)[:, None] * w[None, :]  # (B, N)
    ppo_policy_loss(logp, behav, adv, keep, 0.2, 0.2).loss.backward()
    want = {n: p.grad for n, p in trainer.model.named_parameters() if p.grad is not None}
    assert got.keys() == want.keys() and "value_head.weight" not in got  # GRPO: no critic
    for name, grad in got.items():
        torch.testing.assert_close(grad, want[name], atol=1e-6, rtol=1e-5)


def test_the_default_mode_still_asserts_whole_groups():
    cfg = RunConfig(policy_kwargs=SMALL, group_size=4, partial_rollouts=True)
    task, _, groups, _ = _generate(cfg, _policies(cfg, 3), num_groups=1)
    groups = _scored(groups)
    whole_cfg = replace(cfg, partial_rollouts=False)
    whole = group_learner(task=task, model=cfg.build_policy(task), cfg=whole_cfg)
    whole.version = 2
    with pytest.raises(ValueError, match="whole-group versioning is the default mode's rule"):
        whole.compute_gradients(GroupBatch(groups))
    ok = group_learner(task=task, model=cfg.build_policy(task), cfg=cfg)
    ok.version = 2
    ok.compute_gradients(GroupBatch(groups))  # the same batch is legal in the partial mode
    g = groups[0]
    first, *rest = g.samples
    back = g.with_samples((replace(first, token_versions=torch.tensor([0, 2, 1])), *rest))
    with pytest.raises(ValueError, match="go back"):
        check_token_versions([back], partial=True)
    with pytest.raises(ValueError, match="mixes policy versions"):
        g.with_samples((replace(first, policy_version=1), *rest))


def test_groups_keep_token_versions_through_pickle_and_the_stale_drop():
    cfg = RunConfig(policy_kwargs=SMALL, group_size=4, partial_rollouts=True)
    _, _, groups, _ = _generate(cfg, _policies(cfg, 3), num_groups=2)
    back = pickle.loads(pickle.dumps(groups[0]))
    assert back.samples[0].token_versions.tolist() == [0, 1, 2]
    assert groups[0].newest_version == 2 and groups[0].policy_version == 0
    buf = ExperienceBuffer(batch_groups=2, max_staleness=3, drop_staleness=1)
    for g in _scored(groups):
        buf.admit(g.group_id, 0)
        buf.generated(g)
        buf.put(g)
    # trained at version 3, the groups' newest tokens (version 2) lag 1 <= K: kept whole
    assert [g.group_id for g in buf.take_batch(3)] == [0, 1]


def test_partial_rollouts_config_and_flags():
    with pytest.raises(ValueError, match="Ray engine"):
        RunConfig(partial_rollouts=True, engine="ray")
    with pytest.raises(TypeError, match="partial_rollouts"):  # the run's setting, not a stage's
        RolloutConfig(partial_rollouts=True)  # type: ignore[call-arg]
    with pytest.raises(ValueError, match=r"give RunConfig\(seed=...\)"):
        RunConfig(reward=RewardConfig(seed=3))
    with pytest.raises(ValueError, match="give a RolloutConfig"):
        RunConfig(rollout={"token_delay_s": 0.1})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="weight_check_every"):
        RunConfig(partial_rollouts=True, weight_check_every=0)
    with pytest.raises(ValueError, match="weight_check_every=2 applies to --partial-rollouts"):
        RunConfig(weight_check_every=2)  # would never be read
    cfg = RunConfig(mode="fully-async", max_staleness=4, drop_staleness=2, partial_rollouts=True)
    assert cfg.token_drop_staleness == 2
    assert cfg.partial_rollouts and cfg.to_dict()["partial_rollouts"]
    assert RunConfig().token_drop_staleness is None


def test_partial_rollouts_on_the_local_engine_keep_the_ledger():
    """A slow decoder (0.05 s a token) and trainer (+0.05 s a step): weights arrive while
    responses are half written. Every sample still has exactly one fate."""
    cfg = RunConfig(
        mode="fully-async", max_staleness=2, steps=5, groups_per_rollout=1,
        partial_rollouts=True, rollout=RolloutConfig(token_delay_s=0.05),
        trainer=TrainerConfig(delay_s=0.05), batch_groups=3, group_size=4, eval_every=5,
        policy_kwargs=SMALL, timeout_s=240,
    )  # fmt: skip
    res = run(cfg)
    assert res.steps == 5 and res.ledger.ok
    generated = {gid * 4 + i for gid in res.group_versions for i in range(4)}
    assert set(res.fates) == generated
    assert len([f for f in res.fates.values() if f.startswith("trained@")]) == 5 * 3 * 4
    gens = [s for s in res.spans if s.stage == "rollout"]
    assert any(s.args["last"] > s.args["version"] for s in gens), "no update mid-response"
    assert res.token_staleness_hist and max(res.token_staleness_hist) <= 2
    assert "token_staleness_hist" in res.to_json()["details"]


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--weight-check-every", "2"], "applies to --partial-rollouts"),
        (["--partial-rollouts", "--engine", "ray"], "Ray engine hands a generator"),
        (["--partial-rollouts", "--weight-check-every", "0"], "must be > 0"),
    ],
)
def test_cli_flags_refuse_what_the_mode_cannot_do(argv, needle, capsys):
    from nobubble.cli import main

    try:
        rc = main(["rl", "train", "--steps", "1", *argv])
    except SystemExit as e:
        rc = e.code
    err = capsys.readouterr().err.strip()
    assert rc == 2 and needle in err and len(err.splitlines()) == 1


def test_cli_flags_reach_the_run_config():
    from nobubble.cli import build_parser
    from nobubble.cli.rl import run_config

    def config(*flags: str) -> RunConfig:
        args = build_parser().parse_args(["rl", "train", "--mode", "fully-async", *flags])
        return run_config(args)

    cfg = config("--partial-rollouts", "--weight-check-every", "2", "--token-delay", "0.1")
    assert cfg.weight_check_every == 2
    assert cfg.rollout.token_delay_s == 0.1 and cfg.partial_rollouts
    assert config() == RunConfig(mode="fully-async")
