"""Lag controls in the running system: age weights, KL to a reference, forced syncs, a replay
in the loop, the presets, and the ledger that proves every sample's fate with reuse.

References are written independently of the code under test: the gradient of a weighted
GRPO loss by hand, sampling frequencies against the prioritized-replay formula. The presets'
own tests are in ``test_presets.py``.
"""

from __future__ import annotations

import pytest
import torch

from nobubble.rl.algo.losses import grpo_advantages
from nobubble.rl.system.config import ReplayConfig, RunConfig, TrainerConfig
from nobubble.rl.system.config.presets import aggressive
from nobubble.rl.system.experience import ExperienceBuffer, GroupReplay, GroupState
from nobubble.rl.system.learner import GroupBatch, group_learner
from nobubble.rl.system.orchestrator import run
from nobubble.rl.system.rollout import RolloutWorker
from nobubble.rl.system.types import GroupRequest, Sample, SampleGroup

TINY = dict(batch_groups=2, group_size=4, eval_every=5, policy_kwargs={"hidden": 16}, timeout_s=240)


def _setup(**trainer):
    cfg = RunConfig(group_size=8, policy_kwargs={"hidden": 16}, trainer=TrainerConfig(**trainer))
    task = cfg.make_task()
    torch.manual_seed(0)
    tr = group_learner(task=task, model=cfg.build_policy(task), cfg=cfg)
    gen = RolloutWorker(task=task, model=cfg.build_policy(task), cfg=cfg)
    gen.model.load_state_dict(tr.model.state_dict())
    gen.version = 0
    groups, _ = gen.generate([GroupRequest(i, i, p, 0.0) for i, p in enumerate(task.prompts[:2])])
    scored = [
        g.with_samples(tuple(s.scored(float(s.response[:1] == "0"), 0.0) for s in g.samples))
        for g in groups
    ]
    return task, tr, scored


def test_age_and_is_weights_scale_each_samples_loss():
    """One SGD step of the trainer equals one step on the weighted GRPO loss by hand."""
    task, tr, groups = _setup(lr=0.1, max_grad_norm=1e9, staleness_weighting="inverse")
    tr.version = 3  # group 0 from version 0 (lag 3), group 1 re-labelled as version 2 (lag 1)
    groups[1] = groups[1].with_samples(
        tuple(Sample(**{**s.__dict__, "policy_version": 2}) for s in groups[1].samples)
    )
    tr.optimizer = torch.optim.SGD(tr.model.parameters(), lr=0.1)
    before = {k: v.clone() for k, v in tr.model.state_dict().items()}
    is_weights = [0.5, 2.0]

    # by hand: token-mean of -A w log pi, w = IS weight / (1 + lag), at ratio 1 (no clip)
    model = tr.model
    samples = [s for g in groups for s in g.samples]
    tokens = torch.stack([s.tokens for s in samples])
    mask = torch.stack([s.response_mask for s in samples]).float()
    rewards = torch.tensor([s.reward for s in samples])
    w = torch.tensor([0.5 / 4] * 8 + [2.0 / 2] * 8)
    adv = grpo_advantages(rewards, 8) * w
    logits, _ = model(tokens[:, :-1])
    logp = torch.log_softmax(logits[:, task.prompt_len - 1 :], -1)
    logp = logp.gather(2, tokens[:, task.prompt_len :, None]).squeeze(2)
    log_all = torch.log_softmax(logits[:, task.prompt_len - 1 :], -1)
    uniform_kl = -log_all.mean(-1) - torch.log(torch.tensor(float(log_all.shape[-1])))
    loss = (-(adv[:, None] * logp) * mask).sum() / mask.sum()
    loss = loss + tr.loss.cfg.uniform_kl_coef * (uniform_kl * mask).sum() / mask.sum()
    grads = torch.autograd.grad(loss, list(model.parameters()), allow_unused=True)
    expected = {
        n: before[n] - (0.0 if g is None else 0.1 * g)
        for (n, _), g in zip(model.named_parameters(), grads)
    }

    tr.update([GroupBatch(groups, is_weights)])
    for name, want in expected.items():
        torch.testing.assert_close(tr.model.state_dict()[name], want, rtol=1e-5, atol=1e-6)


def test_kl_to_the_reference_is_zero_at_start_and_resets_on_refresh():
    _, tr, groups = _setup(lr=0.05, kl_coef=0.1, kl_refresh_every=2)
    kls = [tr.update([GroupBatch(groups)]).metrics["kl_ref"] for _ in range(4)]
    assert kls[0] == pytest.approx(0.0, abs=1e-7)  # the reference is the initial policy
    assert kls[1] > 1e-6  # the policy moved away
    assert kls[2] == pytest.approx(0.0, abs=1e-7)  # refreshed after step 2


def _group(gid: int, version: int, rewards: list[float]) -> SampleGroup:
    z = torch.zeros(1)
    samples = tuple(
        Sample(gid * 4 + i, gid, 0, "p", "r", z.long(), z.bool(), z, version).scored(r, 0.0)
        for i, r in enumerate(rewards)
    )
    return SampleGroup(gid, 0, samples)


def test_uniform_replay_draws_distinct_fresh_groups():
    replay = GroupReplay(ReplayConfig(mode="uniform", capacity=3, groups_per_step=2), seed=1)
    replay.add([_group(g, g, [0, 1, 0, 1]) for g in range(5)])  # capacity 3 keeps 2, 3, 4
    seen = set()
    for _ in range(50):
        drawn = replay.sample(2, trainer_version=5, max_staleness=2, beta=0.4)
        ids = [g.group_id for g, _ in drawn]
        assert len(ids) == len(set(ids)) == 2 and set(ids) <= {3, 4}  # 2 is too stale
        assert all(w == 1.0 for _, w in drawn)
        seen |= set(ids)
    assert seen == {3, 4}


def test_prioritized_replay_frequencies_and_weights_follow_the_formula():
    cfg = ReplayConfig(mode="prioritized", capacity=8, groups_per_step=1, alpha=1.0)
    replay = GroupReplay(cfg, seed=0)
    groups = [_group(0, 0, [0, 0, 1, 1]), _group(1, 0, [0, 1, 1, 1]), _group(2, 0, [1, 1, 1, 1])]
    replay.add(groups)
    var = [torch.tensor([s.reward for s in g.samples]).var().item() + 1e-6 for g in groups]
    p = [v / sum(var) for v in var]
    counts = [0, 0, 0]
    n = 4000
    for _ in range(n):
        ((g, w),) = replay.sample(1, trainer_version=0, max_staleness=0, beta=1.0)
        counts[g.group_id] += 1
        want = (3 * p[g.group_id]) ** -1.0 / (3 * min(p)) ** -1.0
        assert w == pytest.approx(want)
    for i in range(3):
        assert counts[i] / n == pytest.approx(p[i], abs=0.03)


def test_ledger_records_reuse_and_refuses_reuse_before_training():
    ledger = ExperienceBuffer(batch_groups=1, max_staleness=0)
    g = _group(0, 0, [0, 1, 0, 1])
    ledger.admit(0, 0)
    with pytest.raises(ValueError, match="never trained"):
        ledger.reused(g, 1)
    ledger.move(0, GroupState.GENERATED, g.sample_ids)
    ledger.move(0, GroupState.SCORED)
    ledger.mark_trained([g], 1)
    ledger.reused(g, 2)
    ledger.reused(g, 3)
    summary = ledger.summary()
    assert summary.ok and summary.trained == 4 and summary.reused == 8
    assert ledger.reuse[0] == [2, 3]


def test_a_forced_sync_trains_only_the_current_version():
    buf = ExperienceBuffer(batch_groups=1, max_staleness=4)
    for gid, version in ((0, 1), (1, 2)):
        buf.admit(gid, 2)
        g = _group(gid, version, [0, 1, 0, 1])
        buf.generated(g)
        buf.put(g)
    (batch,) = [buf.take_batch(2, sync=True)]
    assert [g.group_id for g in batch] == [1]
    assert buf.fate[0] == "dropped:synced"


def test_one_trainer_setting_keeps_the_others():
    """A run that gives only the trainer's delay keeps the default lr and uniform KL, and
    the preset's settings; what it gives wins over both."""
    slow = aggressive(RunConfig(mode="fully-async", trainer=TrainerConfig(delay_s=0.3), **TINY))
    t = slow.trainer
    assert (t.lr, t.uniform_kl_coef, t.delay_s) == (2e-3, 0.05, 0.3)
    assert t.staleness_weighting == "inverse"
    mine = RunConfig(trainer=TrainerConfig(lr=0.01, uniform_kl_coef=0.0), **TINY).trainer
    assert (mine.lr, mine.uniform_kl_coef) == (0.01, 0.0)


def test_replay_sync_and_kl_in_a_real_run_keep_the_ledger_whole():
    cfg = RunConfig(
        mode="fully-async", steps=8, max_staleness=3, sync_every=4,
        replay=ReplayConfig(mode="uniform", capacity=8, groups_per_step=2),
        trainer=TrainerConfig(kl_coef=0.05), **TINY,
    )  # fmt: skip
    res = run(cfg)
    assert res.ledger.ok and res.ledger.reused > 0
    assert all("kl_ref" in m for m in res.step_metrics) and len(res.step_metrics) == 8
    # every sample's fate: trained once (its first), dropped, or unfinished; reuse listed apart
    assert set(res.fates.values()) <= {f"trained@{s}" for s in range(1, 9)} | {
        "dropped:stale", "dropped:synced", "dropped:unfinished",
    }  # fmt: skip
    for versions in res.group_versions.values():
        assert len(set(versions)) == 1  # GRPO: a group is one policy version
