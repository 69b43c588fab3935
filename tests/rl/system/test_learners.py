"""Many learners (``RunConfig.learners``): sync equals one learner on the whole batch, the
asynchronous aggregations learn, the ledger stays whole, bad values and dead learners are
reported.

The exactness test runs the learners' code on two gloo ranks (:func:`nobubble.distributed.spawn`)
against a plain single-process loop on the concatenated batches, in float64: the reference
objective (``trainer_reference``, built on `tests/rl/algo/reference.py`, no
:class:`Learner` code), its gradient clipped, Adam. The other tests are short runs of the
local engine.
"""

from __future__ import annotations

import time

import pytest
import torch

from nobubble.distributed import DistContext, spawn
from nobubble.rl.system.config import ReplayConfig, RunConfig
from nobubble.rl.system.engines.worker import Message, StepCollector, split_groups
from nobubble.rl.system.learner import GroupBatch, Learner, TrainResult, group_learner
from nobubble.rl.system.orchestrator import WorkerError, run
from nobubble.rl.system.rollout import RolloutWorker
from nobubble.rl.system.types import GroupRequest, SampleGroup, Span
from tests.rl.system.trainer_reference import reference_train_step

TINY = dict(batch_groups=4, group_size=4, eval_every=2, policy_kwargs={"hidden": 32}, timeout_s=240)
EXACT = RunConfig(group_size=8, batch_groups=5, policy_kwargs={"hidden": 32})
NUM_STEPS = 3


def _batches(cfg: RunConfig) -> list[list[SampleGroup]]:
    """NUM_STEPS batches of ``batch_groups`` groups sampled by the initial policy, scored 1
    for a response that starts with "0" (so every group has both kinds)."""
    task = cfg.make_task()
    torch.manual_seed(0)
    model = cfg.build_policy(task)
    gen = RolloutWorker(task=task, model=model, cfg=cfg)
    gen.version = 0  # the weights it holds are version 0's
    n = NUM_STEPS * cfg.batch_groups
    prompts = [task.prompts[(7 * i) % task.num_prompts] for i in range(n)]
    groups, _ = gen.generate([GroupRequest(i, i, p, 0.0) for i, p in enumerate(prompts)])
    scored = [
        g.with_samples(tuple(s.scored(float(s.response[:1] == "0"), 0.0) for s in g.samples))
        for g in groups
    ]
    b = cfg.batch_groups
    return [scored[i * b : (i + 1) * b] for i in range(NUM_STEPS)]


def _fp64_learner(cfg: RunConfig) -> Learner:
    task = cfg.make_task()
    torch.manual_seed(cfg.seed)
    return group_learner(task=task, model=cfg.build_policy(task).double(), cfg=cfg)


def _sync_learner(ctx: DistContext, cfg: RunConfig, batches: list[list[SampleGroup]]) -> dict:
    learner = _fp64_learner(cfg)
    learner.join(ctx, "sync", 1)
    for batch in batches:
        shard, weights = split_groups(batch, None, ctx.world_size)[ctx.rank]
        learner.update([GroupBatch(shard, weights)])
    return {k: v.detach().clone() for k, v in learner.model.state_dict().items()}


def _reference_run(cfg: RunConfig, batches: list[list[SampleGroup]]) -> tuple[dict, dict]:
    """The parameters before and after one process steps the reference objective on each
    whole batch (version = step index, as a trainer's); the same initial policy as the
    learners'."""
    task = cfg.make_task()
    torch.manual_seed(cfg.seed)
    model = cfg.build_policy(task).double()
    start = {k: v.detach().clone() for k, v in model.state_dict().items()}
    opt = torch.optim.Adam(model.parameters(), lr=cfg.trainer.lr)
    for version, batch in enumerate(batches):
        reference_train_step(model, opt, batch, cfg, task, version)
    return start, {k: v.detach().clone() for k, v in model.state_dict().items()}


def test_sync_learners_equal_one_learner_on_the_whole_batch():
    """2 learners on shards of 3 + 2 groups (unequal token counts) for 3 steps hold the
    parameters of a single process stepping the reference objective on the 5 groups, within
    1e-6 in float64 (the trainer builds its advantages in float32, the reference in
    float64)."""
    batches = _batches(EXACT)
    start, expected = _reference_run(EXACT, batches)
    ranks = spawn(_sync_learner, 2, args=(EXACT, batches), timeout_s=180)
    moved = max((expected[k] - start[k]).abs().max().item() for k in expected)
    assert moved > 1e-3  # the steps did move the policy
    for state in ranks:
        for name, value in expected.items():
            assert value.dtype == torch.float64
            assert torch.allclose(state[name], value, rtol=0, atol=1e-6), name


def _staleness_learner(ctx: DistContext, cfg: RunConfig, batch: list[SampleGroup]) -> tuple:
    learner = _fp64_learner(cfg)
    learner.join(ctx, "staleness", 1)
    shard, _ = split_groups(batch, None, ctx.world_size)[ctx.rank]
    if ctx.rank == 0:
        time.sleep(2.0)  # learner 1's push is there before learner 0's own gradient
    pushes = learner.update([GroupBatch(shard)]).pushes
    params = {k: v.detach().clone() for k, v in learner.model.state_dict().items()}
    return params, pushes, learner.version


def test_staleness_learners_apply_every_gradient_in_arrival_order():
    """Learner 0 serves its own model: its gradient and learner 1's (usually there first),
    both computed on the initial weights, are applied one Adam step each in the order it
    logged, the second scaled by 1 / (1 + 1); the same steps in one process give the same
    parameters."""
    batch = _batches(EXACT)[0]
    (state, pushes, version), (_, _, version_1) = spawn(
        _staleness_learner, 2, args=(EXACT, batch), timeout_s=180
    )
    assert (version, version_1) == (1, 0)  # learner 1 never steps: it pushes
    assert sorted(who for who, _, _ in pushes) == [0, 1]
    assert [(lag, w) for _, lag, w in pushes] == [(0, 1.0), (1, 0.5)]
    ref = _fp64_learner(EXACT)
    grads = []
    for shard, _ in split_groups(batch, None, 2):
        ref.compute_gradients(GroupBatch(shard))
        ref.clip_gradients()
        grads.append(
            [
                torch.zeros_like(p) if p.grad is None else p.grad.clone()
                for p in ref.model.parameters()
            ]
        )
    for who, _, weight in pushes:
        for p, g in zip(ref.model.parameters(), grads[who]):
            p.grad = weight * g
        ref.optimizer.step()
    for name, value in ref.model.state_dict().items():
        assert torch.allclose(state[name], value, rtol=0, atol=1e-12), name


def test_split_groups_keeps_groups_whole_and_in_order():
    groups = list(range(7))
    shards = split_groups(groups, [float(g) for g in groups], 3)  # type: ignore[arg-type]
    assert [s for s, _ in shards] == [[0, 1, 2], [3, 4], [5, 6]]
    assert [w for _, w in shards] == [[0.0, 1.0, 2.0], [3.0, 4.0], [5.0, 6.0]]
    with pytest.raises(ValueError, match="every learner needs"):
        split_groups(groups[:1], None, 2)  # type: ignore[arg-type]


def _result(version: int, groups: list[int], learner: int, reward: float) -> TrainResult:
    span = Span("trainer", "train", 0.0, 1.0)
    by = dict.fromkeys(groups, learner)
    return TrainResult(version, [0] * len(groups), {"reward": reward}, span, by)


def test_step_collector_merges_one_step_and_refuses_a_wrong_shard():
    """Learner 0's train (and eval) waits for the other learner's shard, then one message."""
    col = StepCollector(2)
    col.expect([[0, 1], [2]])
    ev = Message("eval", "trainer")
    assert col.feed([Message("train", "trainer", _result(1, [0, 1], 0, 1.0)), ev]) == []
    (train, after) = col.feed([Message("shard", "trainer-1", _result(0, [2], 1, 0.0))])
    assert after is ev
    assert train.payload.trained_by == {0: 0, 1: 0, 2: 1}
    assert train.payload.metrics["reward"] == pytest.approx(2 / 3)  # weighted by groups
    col.expect([[3], [4]])
    col.feed([Message("train", "trainer", _result(2, [3], 0, 1.0))])
    with pytest.raises(WorkerError, match="trainer-1 reported groups \\[5\\]"):
        col.feed([Message("shard", "trainer-1", _result(1, [5], 1, 0.0))])


@pytest.mark.parametrize(
    ("over", "match"),
    [
        ({"learners": 0}, "learners=0 must be"),
        ({"learners": 5}, "learners=5 > batch_groups=4"),
        ({"learners": 2, "aggregation": "mean"}, "aggregation='mean' is unknown"),
        ({"aggregation": "async"}, "give learners >= 2"),
        ({"learners": 2, "local_sgd_every": 3}, "local_sgd_every=3 applies to"),
        (
            {"learners": 2, "aggregation": "local-sgd", "local_sgd_every": 0},
            "local_sgd_every=0 must be an integer >= 1",
        ),
        (
            {"learners": 2, "aggregation": "async", "checkpoint_dir": "/tmp/x"},
            "only 'sync' learners",
        ),
    ],
)
def test_bad_learner_settings_are_refused_before_any_work(over, match):
    with pytest.raises(ValueError, match=match):
        RunConfig(**{**TINY, **over})


def test_the_cli_refuses_bad_learners_with_exit_2(capsys):
    from nobubble.cli import main

    assert main(["rl", "train", "--learners", "5", "--batch-groups", "4"]) == 2
    out, err = capsys.readouterr()
    assert "learners=5 > batch_groups=4" in err and out == ""  # refused before any work
    assert main(["rl", "train", "--learners", "2", "--local-sgd-every", "3"]) == 2
    out, err = capsys.readouterr()
    assert "--aggregation local-sgd" in err and out == ""


def check_ledger(res, cfg: RunConfig) -> None:
    """Every generated sample has one fate; every trained group names its learner; each
    step trained one whole batch, split among the learners."""
    assert res.ledger.ok
    generated = {
        gid * cfg.group_size + i for gid in res.group_versions for i in range(cfg.group_size)
    }
    assert set(res.fates) == generated
    trained = [f for f in res.fates.values() if f.startswith("trained@")]
    assert len(trained) == res.steps * cfg.batch_groups * cfg.group_size == res.trained_samples
    by = res.ledger.by_learner
    assert set(by) == set(range(cfg.learners))
    assert sum(by.values()) == res.trained_samples + res.ledger.reused
    assert res.weight_versions == list(range(res.steps + 1))


@pytest.mark.parametrize("aggregation", ["sync", "async", "local-sgd"])
def test_ledger_is_whole_with_two_learners(aggregation):
    """With a replay (sync), reused groups are recorded with the learner that reused them."""
    replay = {"replay": ReplayConfig(mode="uniform", capacity=16, groups_per_step=2)}
    cfg = RunConfig(
        mode="fully-async",
        max_staleness=3,
        steps=5,
        learners=2,
        aggregation=aggregation,
        local_sgd_every=2 if aggregation == "local-sgd" else None,
        stall_timeout_s=60,
        **(replay if aggregation == "sync" else {}),
        **TINY,
    )
    res = run(cfg)
    assert res.steps == 5
    check_ledger(res, cfg)
    if aggregation == "sync":
        assert res.ledger.reused > 0
    if aggregation == "async":
        assert all("push_staleness_max" in m for m in res.step_metrics)
    if aggregation == "local-sgd":
        assert [m["params_averaged"] for m in res.step_metrics] == [0, 1, 0, 1, 0]


@pytest.mark.parametrize(
    ("fault", "match"),
    [
        ("trainer-1:2:raise", "trainer-1 failed.*InjectedFault"),
        ("trainer-1:2:kill", "trainer-1 died with exit code -9"),
    ],
)
def test_a_failing_learner_is_named_not_timed_out(fault, match):
    with pytest.raises(WorkerError, match=match):  # the learner's own error, not a stall
        run(
            RunConfig(
                mode="one-step-off", steps=6, learners=2, fault=fault, stall_timeout_s=60, **TINY
            )
        )


@pytest.mark.long
@pytest.mark.timeout(300)
@pytest.mark.parametrize("aggregation", ["staleness"])  # async: the same path, unweighted
def test_two_asynchronous_learners_learn_digits(aggregation):
    """The short form: stops at accuracy 0.4 (from about 0.05). The full runs to 0.9, of
    ``async`` too, are benchmarks/rl_learners.py's (docs/rl/system.md, "Many learners"): on
    2 shared cores both modes reached 0.9 on seeds 1 and 2, in 29-64 s. ``async`` runs the
    same code without the staleness scale; its ledger and failure cases are tested above."""
    cfg = RunConfig(
        mode="fully-async",
        learners=2,
        aggregation=aggregation,
        steps=800,
        target_accuracy=0.4,
        time_budget_s=150,
        seed=1,
        eval_every=10,
    )
    res = run(cfg)
    start, best = res.curve[0].accuracy, max(p.accuracy for p in res.curve)
    assert best >= max(0.4, 2 * start), res.curve
    assert res.ledger.ok and set(res.ledger.by_learner) == {0, 1}


@pytest.mark.long  # the local engine covers the learners, test_engines_ray the Ray engine
@pytest.mark.timeout(300)
def test_two_learners_on_the_ray_engine(ray_session):
    """Ray actors form the group; async learner 1 computes on weights handed over by Ray."""
    cfg = RunConfig(
        engine="ray",
        mode="one-step-off",
        steps=4,
        learners=2,
        aggregation="async",
        stall_timeout_s=90,
        **{**TINY, "batch_groups": 3},
    )
    res = run(cfg)
    assert res.steps == 4
    check_ledger(res, cfg)
    assert res.ledger.by_learner == {0: 2 * 4 * 4, 1: 1 * 4 * 4}  # shards of 2 + 1 groups
