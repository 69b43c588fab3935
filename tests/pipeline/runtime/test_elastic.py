"""Re-planning while training (``nobubble.pipeline.runtime.elastic``, the runner's hook).

References: brute force over every contiguous cut for the partition; one process training the
whole model (torch's own modules, AdamW, the same batches) for a pipeline whose layers move
between ranks mid-run, weights and optimizer state included.
"""

from __future__ import annotations

import itertools

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch import nn

from nobubble.distributed import spawn
from nobubble.pipeline import get_schedule
from nobubble.pipeline.runtime.elastic import Replanner, balanced_sizes, replan_decision
from nobubble.pipeline.runtime.elastic.migrate import owners
from nobubble.pipeline.runtime.elastic.partition import bottleneck, speeds_from_times
from nobubble.pipeline.runtime.elastic.policy import ReplanPolicy
from nobubble.pipeline.runtime.runner import PipelineRunner
from tests.pipeline.runtime.torch_model import batch, blocks, loss_fn

positive = st.floats(0.1, 10.0, allow_nan=False)


def _all_cuts(n: int, p: int):
    for cuts in itertools.combinations(range(1, n), p - 1):
        bounds = (0, *cuts, n)
        yield tuple(b - a for a, b in itertools.pairwise(bounds))


@given(st.data())
def test_balanced_sizes_is_the_least_bottleneck_of_every_cut(data) -> None:
    p = data.draw(st.integers(1, 4))
    costs = data.draw(st.lists(positive, min_size=p, max_size=8))
    speeds = data.draw(st.lists(positive, min_size=p, max_size=p))
    sizes = balanced_sizes(costs, speeds)
    assert len(sizes) == p and sum(sizes) == len(costs) and min(sizes) >= 1
    brute = min(bottleneck(c, costs, speeds) for c in _all_cuts(len(costs), p))
    assert bottleneck(sizes, costs, speeds) == pytest.approx(brute, rel=1e-9)
    prefer = data.draw(st.sampled_from(list(_all_cuts(len(costs), p))))
    kept = balanced_sizes(costs, speeds, prefer=prefer)
    optimal = bottleneck(prefer, costs, speeds) <= brute * (1 + 1e-9)
    assert kept == (tuple(prefer) if optimal else sizes)


def test_a_straggler_moves_layers_off_its_rank_and_equal_speeds_keep_the_cut() -> None:
    costs = [1.0] * 16
    even = balanced_sizes(costs, [1, 1, 1, 1])
    assert even == (4, 4, 4, 4)
    steady = replan_decision(even, costs, [1, 1, 1, 1], [1.05, 1, 0.97, 1])
    assert not steady.replan and steady.sizes == even  # noise below the threshold
    slow = replan_decision(even, costs, [1, 1, 1, 1], [1, 1.5, 1, 1])
    assert slow.replan and slow.sizes[1] < 4 and slow.predicted < slow.current == 6.0
    # a drift no cut can help (every rank slower alike) does not move layers
    alike = replan_decision(even, costs, [1, 1, 1, 1], [2, 2, 2, 2])
    assert not alike.replan and alike.drift == pytest.approx(1.0)


def test_the_policy_replans_after_patience_drifted_steps_and_not_on_one_noisy_step() -> None:
    even, costs = (4, 4), [1.0] * 8
    policy = ReplanPolicy(costs)  # threshold 0.2, min_gain 0.05, patience 2
    answers = [policy.observe(even, s) for s in ([9, 9], [1, 1], [1, 1], [1, 1.5], [1, 1])]
    assert answers == [None] * 5  # warm-up (any speeds), steady, one noisy step
    answers = [policy.observe(even, s) for s in ([1, 3], [1, 3])]
    assert answers == [None, (6, 2)]  # the second slow step in a row moves layers off rank 1
    policy.restart()  # the new cut's first step is warm-up again, whatever it reads
    assert policy.observe((6, 2), [5, 5]) is None
    assert policy.planned([1, 1]) == (1, 3)  # the plan is the slow speeds the cut was made for


def test_a_rank_slow_from_the_start_drifts_from_the_equal_speeds_of_the_first_cut() -> None:
    policy = ReplanPolicy([1.0] * 8)
    answers = [policy.observe((4, 4), s) for s in ([1, 3], [1, 3], [1, 3])]
    assert answers == [None, None, (6, 2)]  # warm-up, then patience 2


def test_a_slowness_no_cut_helps_is_planned_for_and_not_reconsidered() -> None:
    policy = ReplanPolicy([1.0] * 8)
    answers = [policy.observe((4, 4), s) for s in ([1, 1], [1, 1], [2, 2], [2, 2], [2, 2])]
    assert answers == [None] * 5 and policy.planned([1, 1]) == (2, 2)
    never = ReplanPolicy([1.0] * 8, replan=False)
    assert [never.observe((4, 4), s) for s in ([1, 1], [1, 3], [1, 3], [1, 3])] == [None] * 4
    with pytest.raises(ValueError, match="patience=0"):
        ReplanPolicy([1.0] * 8, patience=0)


def test_speeds_are_time_per_unit_of_held_cost() -> None:
    assert speeds_from_times([8.0, 3.0], [2, 1], [1.0, 3.0, 1.5]) == (2.0, 2.0)
    assert owners((2, 1, 3)) == [0, 0, 1, 2, 2, 2]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"schedule": "zb-v"}, "1-chunk schedule"),
        ({"sizes": (8, 0)}, r"sizes \[8, 0\] must be 2 counts"),
        ({"layer_costs": (1.0,) * 3}, "3 layer_costs for 8 layers"),
        ({"threshold": -1.0}, "threshold=-1.0"),
    ],
)
def test_bad_arguments_are_refused_before_any_process_group(kwargs, message) -> None:
    name = kwargs.pop("schedule", "zb-h1")
    sched = get_schedule(name, num_ranks=2, num_microbatches=4)
    with pytest.raises(ValueError, match=message):
        Replanner(blocks(8), sched, torch.optim.SGD, **kwargs)


def _adamw(params) -> torch.optim.Optimizer:
    # eps well above rounding noise: the attention's key bias has a gradient of exactly 0 in
    # theory, and Adam with a tiny eps turns its rounding noise (1e-10) into full-size steps
    return torch.optim.AdamW(params, lr=1e-2, weight_decay=0.01, eps=1e-4)


MOVES = {1: ((6, 2), None), 3: ((2, 6), "zb-2p")}  # after step k: the new cut (and order)


def _elastic_rank(ctx, batches: list) -> tuple[list[float], list[dict]]:
    sched = get_schedule("zb-h1", num_ranks=ctx.world_size, num_microbatches=4)
    replan = Replanner(blocks(8), sched, _adamw, replan=False)
    runner = PipelineRunner(replan.stages(), sched, loss_fn, hooks=[replan])
    with pytest.raises(ValueError, match="1 stage modules for schedule"):
        runner.restage(replan.stages()[:1])  # refused before anything changed
    losses = []
    for k, (x, y) in enumerate(batches):
        losses.append(float(runner.step(x, y)))
        replan.optimizer.step()
        replan.optimizer.zero_grad(set_to_none=True)
        if k in MOVES:
            sizes, name = MOVES[k]
            new = None if name is None else get_schedule(name, num_ranks=2, num_microbatches=4)
            replan.repartition(runner, sizes, new)
    assert [r.sizes for r in replan.history] == [(4, 4), (4, 4), (6, 2), (6, 2), (2, 6)]
    assert runner.schedule.name.startswith("zb-2p") and runner.stage_modules
    state = replan.layer_state()
    runner.close()
    return losses, state


def test_layers_that_move_mid_run_train_as_one_process_would() -> None:
    batches = [batch(8, 6, seed=k) for k in range(5)]
    results = spawn(_elastic_rank, 2, args=(batches,), timeout_s=240)
    model = nn.Sequential(*blocks(8))
    opt = _adamw(list(model.parameters()))
    ref_losses = []
    for x, y in batches:  # the mean microbatch loss, one backward, one AdamW step
        loss = sum(loss_fn(model(a), b) for a, b in zip(x.chunk(4), y.chunk(4), strict=True)) / 4
        loss.backward()
        opt.step()
        opt.zero_grad()
        ref_losses.append(float(loss.detach()))
    for losses, state in results:
        assert losses == pytest.approx(ref_losses, rel=1e-5)
        for i, layer in enumerate(model):
            for key, ref in layer.state_dict().items():
                torch.testing.assert_close(state[i][key], ref, rtol=1e-5, atol=1e-6,
                                           msg=f"layer {i} {key}")  # fmt: skip
