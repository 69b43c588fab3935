"""PipelineRunner on a model of torch's own modules, against one process running it whole.

Reference: :func:`nobubble.pipeline.reference.reference_step`, ``nn.Sequential(*stages)`` in
this process, the mean of the microbatch losses, one ``backward``; the runner's loss and every parameter's gradient must match (fp32, rtol
1e-5), for every schedule, on 2 and 4 gloo ranks.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch import nn

from nobubble.distributed import RankFailure, spawn
from nobubble.pipeline import simulate
from nobubble.pipeline.reference import reference_step
from nobubble.pipeline.runtime.autosplit import ModuleSplit
from nobubble.pipeline.runtime.channel import incoming
from nobubble.pipeline.runtime.profile import OpTimes, costs_from_op_times
from nobubble.pipeline.runtime.runner import PipelineRunner, split_model
from tests.pipeline.runtime.runner_check import (
    NUM_MB,
    check_against_reference,
    pipeline_rank,
    schedule,
)
from tests.pipeline.runtime.torch_model import batch, blocks, loss_fn, stages

SCHEDULES = ("gpipe", "1f1b", "zb-h1", "zb-h2", "zb-2p", "interleaved-1f1b", "zb-v")
TWO_CHUNKS = ("interleaved-1f1b", "zb-v")


@pytest.mark.parametrize("num_ranks", [2, 4])
def test_every_schedule_matches_one_process(num_ranks: int) -> None:
    x, y = batch(8, 6)
    xs, ys = list(x.chunk(NUM_MB)), list(y.chunk(NUM_MB))
    results = spawn(pipeline_rank, num_ranks, args=(SCHEDULES, xs, ys), timeout_s=240)
    check_against_reference(results, SCHEDULES, num_ranks, xs, ys)


def test_variable_sequence_lengths_across_microbatches() -> None:
    """Each microbatch has its own sequence length; the receivers learn each shape."""
    pairs = [batch(2, seq_len, seed=seq_len) for seq_len in (3, 7, 5, 9)]
    xs, ys = [p[0] for p in pairs], [p[1] for p in pairs]
    names = ("zb-h1", "zb-v")
    results = spawn(pipeline_rank, 2, args=(names, xs, ys), timeout_s=240)
    check_against_reference(results, names, 2, xs, ys)


@pytest.mark.parametrize("first_stage", [True, False])
def test_module_split_defers_every_weight_gradient_in_one_process(first_stage: bool) -> None:
    """B touches no .grad; W alone gives the plain backward's gradients. A first stage (token
    ids in) does its whole backward in W; a later stage (activations in) leaves W only the
    weight side of the nodes where the weights meet the activations."""
    model, ref = nn.Sequential(*blocks(6)), nn.Sequential(*blocks(6))
    x, y = batch(4, 5)
    stage_input = None
    if not first_stage:  # start after the embedding: the stage input is an activation
        model, ref = model[1:], ref[1:]
        x = torch.randn(4, 5, model[0].self_attn.embed_dim)
        stage_input = x.clone().requires_grad_(True)
    ref_in = x.clone().requires_grad_(not first_stage)
    loss_fn(ref(ref_in), y).backward()
    split = ModuleSplit(model)
    with split.recording(0):
        out = loss_fn(model(stage_input if stage_input is not None else x), y)
    dx = split.backward_input(0, out, None, stage_input)
    assert all(p.grad is None for p in model.parameters())
    if not first_stage:
        torch.testing.assert_close(dx, ref_in.grad, rtol=1e-5, atol=1e-7)
    split.backward_weight(0)
    for (name, p), q in zip(model.named_parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-5, atol=1e-7, msg=name)
    rep = split.report()
    assert rep is not None and rep.by_stage_graph == 0 and rep.deferred_fraction == 1.0
    assert rep.by_linear > 0 and rep.linear_wgrad_flops > 0
    rest = rep.by_w_walk if first_stage else rep.by_module_graph
    assert rep.by_linear + rest == rep.num_params
    split.close()
    assert "forward" not in model[-1][1].__dict__  # the Linear's own forward is back


def test_an_unsplit_first_stage_runs_autograds_own_backward_in_w() -> None:
    """Recorded with split=False (as the runner records stage 0): B computes nothing, W is
    the plain backward; a stage whose input needs a gradient cannot be recorded so."""
    model, ref = nn.Sequential(*blocks(4)), nn.Sequential(*blocks(4))
    x, y = batch(4, 5)
    loss_fn(ref(x), y).backward()
    split = ModuleSplit(model)
    with split.recording(0, split=False):
        out = loss_fn(model(x), y)
    assert split.backward_input(0, out, None, None) is None
    assert all(p.grad is None for p in model.parameters())
    split.backward_weight(0)
    for (name, p), q in zip(model.named_parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-5, atol=1e-7, msg=name)
    rep = split.report()
    assert rep is not None and rep.by_w_walk == rep.num_params and rep.deferred_fraction == 1.0
    act = torch.randn(4, 5, model[1].self_attn.embed_dim, requires_grad=True)
    with split.recording(1, split=False):
        out = loss_fn(model[1:](act), y)
    with pytest.raises(RuntimeError, match="recorded with split=False"):
        split.backward_input(1, out, None, act)
    split.close()


class _Functional(nn.Module):
    """Uses a child's weight without calling the child (no linear forward runs)."""

    def __init__(self) -> None:
        super().__init__()
        self.inner = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(x @ self.inner.weight.t() + self.inner.bias)


def test_a_weight_used_without_its_module_meets_b_at_its_matmul() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(_Functional(), nn.Linear(4, 2))
    ref = nn.Sequential(_Functional(), nn.Linear(4, 2))
    ref.load_state_dict(model.state_dict())
    x = torch.randn(3, 4, requires_grad=True)
    ref(x).sum().backward()
    split = ModuleSplit(model)
    xin = x.detach().requires_grad_(True)
    with split.recording(0):
        out = model(xin).sum()
    dx = split.backward_input(0, out, None, xin)
    split.backward_weight(0)
    torch.testing.assert_close(dx, x.grad)
    for p, q in zip(model.parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad)
    rep = split.report()
    assert rep is not None and (rep.by_linear, rep.by_module_graph, rep.by_stage_graph) == (2, 2, 0)


def _bad_rank(ctx, case: str) -> None:
    sched = schedule("zb-h1", ctx.world_size)
    mods: list = stages(2)
    x, y = batch(8, 4)
    if case == "count":
        PipelineRunner(mods[:1], sched, loss_fn)
    elif case == "missing stage":
        mods[ctx.rank] = None
        PipelineRunner(mods, sched, loss_fn)
    elif case == "no targets":
        PipelineRunner(mods, sched, loss_fn).step(x, None)
    elif case == "uneven":
        PipelineRunner(mods, sched, loss_fn).step(x[:7], y[:7])
    else:  # a stage that returns a tuple
        mods[0] = nn.Sequential(mods[0], _Pair())
        PipelineRunner(mods, sched, loss_fn, timeout_s=20).step(x, y)


class _Pair(nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return x, x


@pytest.mark.parametrize(
    ("case", "message"),
    [
        ("count", "1 stage modules for schedule 'zb-h1' with 2 stages"),
        ("missing stage", r"runs stages \[\d\] but stages \[\d\] are None"),
        ("no targets", "targets is None on a rank that needs it"),
        ("uneven", "7 rows, not divisible by num_microbatches=4"),
        ("tuple output", "stage 0's output is a tuple; a stage must return one tensor"),
    ],
)
def test_bad_use_is_refused_with_a_message(case: str, message: str) -> None:
    with pytest.raises(RankFailure, match=message):
        spawn(_bad_rank, 2, args=(case,), timeout_s=60)


@given(
    num_blocks=st.integers(1, 12),
    data=st.data(),
    balance=st.sampled_from([None, "params"]),
)
def test_split_model_cuts_every_block_once_in_order(num_blocks, data, balance) -> None:
    num_stages = data.draw(st.integers(1, num_blocks))
    widths = data.draw(st.lists(st.integers(1, 8), min_size=num_blocks, max_size=num_blocks))
    model = nn.Sequential(*[nn.Linear(w, w) for w in widths])
    parts = split_model(model, num_stages, balance=balance)
    assert len(parts) == num_stages and all(len(p) >= 1 for p in parts)
    assert [m for p in parts for m in p] == list(model)  # the same modules, in order


def test_split_model_refuses_more_stages_than_blocks() -> None:
    with pytest.raises(ValueError, match="num_stages=3 for 2 blocks"):
        split_model(nn.Sequential(nn.ReLU(), nn.ReLU()), 3)


def _recompute_rank(ctx, names: tuple[str, ...], xs: list, ys: list) -> dict:
    out = {}
    for name in names:
        sched = schedule(name, ctx.world_size)
        for recompute in (False, True):
            mods = stages(sched.num_stages)
            calls = {"n": 0}

            def count(*_, calls=calls) -> None:
                calls["n"] += 1

            for m in mods:
                m.register_forward_hook(count)
            runner = PipelineRunner(mods, sched, loss_fn, recompute=recompute)
            loss = runner.step(list(xs), list(ys))
            grads = {
                f"{s}.{n}": p.grad.clone()
                for s, m in runner.stage_modules.items()
                for n, p in m.named_parameters()
            }
            out[(name, recompute)] = (float(loss), grads, runner.peak_activation_bytes,
                                      calls["n"] / (len(runner.stage_modules) * NUM_MB))  # fmt: skip
            runner.close()
    return out


def test_recompute_gives_the_same_gradients_with_less_memory_and_one_more_forward() -> None:
    x, y = batch(8, 6)
    xs, ys = list(x.chunk(NUM_MB)), list(y.chunk(NUM_MB))
    names = ("1f1b", "zb-h1", "zb-v")
    results = spawn(_recompute_rank, 2, args=(names, xs, ys), timeout_s=240)
    for name in names:
        ref_loss, ref_grads = reference_step(stages(schedule(name, 2).num_stages), xs, ys, loss_fn)
        got = {k: v for r in results for k, v in r[(name, True)][1].items()}
        for key, ref in ref_grads.items():
            torch.testing.assert_close(got[key], ref, rtol=1e-5, atol=1e-7, msg=f"{name} {key}")
        for r in results:
            assert r[(name, True)][0] == pytest.approx(ref_loss, rel=1e-6)
            assert r[(name, False)][3] == 1.0 and r[(name, True)][3] == 2.0  # forwards per mb
        # rank 0 keeps microbatches in flight: recompute holds less for backward there
        assert results[0][(name, True)][2] < results[0][(name, False)][2], name


def test_profile_modules_measures_what_the_simulator_needs() -> None:
    from nobubble.pipeline import simulate
    from nobubble.pipeline.runtime.profile import profile_modules

    x, y = batch(2, 6)
    prof = profile_modules(stages(2), x, y, loss_fn, repeats=2, warmup=1)
    assert len(prof.stages) == 2 and prof.model == "user" and prof.microbatch_size == 2
    first, last = prof.stages
    assert first.t_f > 0 and first.t_w > 0 and last.t_b > 0 and last.t_w > 0
    assert first.mem_f > 0 and last.mem_f > 0 and prof.activation_bytes == 2 * 6 * 16 * 4
    sched = schedule("zb-h1", 2)
    assert simulate(sched, prof.cost_model(sched)).makespan > 0


def _dropout_rank(ctx) -> list[dict[str, torch.Tensor]]:
    sched = schedule("zb-h1", ctx.world_size)
    x, y = batch(8, 6)
    out = []
    for recompute in (False, True):
        mods = stages(2)
        mods[0] = nn.Sequential(mods[0], nn.Dropout(0.5))  # random masks in F
        torch.manual_seed(ctx.rank)
        runner = PipelineRunner(mods, sched, loss_fn, recompute=recompute)
        for _ in range(2):  # the second step draws after the first step's recomputes
            runner.step(x, y)
        out.append({n: p.grad.clone() for m in runner.stage_modules.values()
                    for n, p in m.named_parameters()})  # fmt: skip
        runner.close()
    return out


def test_recompute_draws_the_same_dropout_masks_as_the_first_forward() -> None:
    for plain, recomputed in spawn(_dropout_rank, 2, timeout_s=240):
        for name, grad in plain.items():
            torch.testing.assert_close(recomputed[name], grad, rtol=1e-5, atol=1e-7, msg=name)


class _Recorder(OpTimes):
    """OpTimes that also keeps what it was told, in order."""

    def __init__(self) -> None:
        super().__init__()
        self.seen_before: list[str] = []
        self.seen_after: list = []

    def before(self, action) -> None:
        self.seen_before.append(str(action))

    def after(self, timing) -> None:
        super().after(timing)
        self.seen_after.append(timing)


def _static_rank(ctx, names: tuple[str, ...], xs: list, ys: list, change: bool) -> dict:
    out = {}
    for name in names:
        sched = schedule(name, ctx.world_size)
        seen = _Recorder()
        runner = PipelineRunner(stages(sched.num_stages), sched, loss_fn, static_shapes=True,
                                timeout_s=30, observer=seen)  # fmt: skip
        losses, peaks = [], []
        for _ in range(3):
            losses.append(float(runner.step(list(xs), list(ys))))
            peaks.append(runner.peak_activation_bytes)
        if change:  # one microbatch longer than in the first steps
            longer = batch(2, 11, seed=11)
            runner.step([longer[0], *xs[1:]], [longer[1], *ys[1:]])
        grads = {f"{s}.{n}": p.grad.clone() / 3 for s, m in runner.stage_modules.items()
                 for n, p in m.named_parameters()}  # fmt: skip
        runner.close()
        plain = PipelineRunner(stages(sched.num_stages), sched, loss_fn)  # counts every step
        plain.step(list(xs), list(ys))
        out[name] = (losses, grads, peaks, plain.peak_activation_bytes, seen, seen.medians())
        plain.close()
    return out


def _check_observed(sched, rank: int, seen: _Recorder, medians: dict, steps: int) -> None:
    """The observer saw this rank's actions in schedule order, every step, each with the
    message the schedule says it receives, and times that run forward."""
    own = [str(a) for a in sched.rank_actions[rank]]
    assert seen.seen_before == own * steps
    assert [str(t.action) for t in seen.seen_after] == own * steps
    for t in seen.seen_after:
        assert t.wait_start <= t.start <= t.end
        need = incoming(sched, t.action)
        assert t.message == need
    assert set(medians) == {(a.op.value, a.stage) for a in sched.rank_actions[rank]}
    assert all(v > 0 for v in medians.values())


def test_static_shapes_give_the_same_gradients_and_count_memory_once():
    pairs = [batch(2, seq_len, seed=seq_len) for seq_len in (3, 7, 5, 9)]  # fixed per microbatch
    xs, ys = [p[0] for p in pairs], [p[1] for p in pairs]
    names = ("1f1b", "zb-h1", "zb-v")
    results = spawn(_static_rank, 2, args=(names, xs, ys, False), timeout_s=240)
    for name in names:
        ref_loss, ref_grads = reference_step(stages(schedule(name, 2).num_stages), xs, ys, loss_fn)
        got: dict[str, torch.Tensor] = {}
        for r in results:
            assert r[name][0] == pytest.approx([ref_loss] * 3, rel=1e-6), name
            got.update(r[name][1])
            assert r[name][2] == [r[name][3]] * 3, name  # counted once, the same every step
        for rank, r in enumerate(results):
            _check_observed(schedule(name, 2), rank, r[name][4], r[name][5], steps=3)
        merged = {k: v for r in results for k, v in r[name][5].items()}
        costs = costs_from_op_times(merged, schedule(name, 2).num_stages)
        assert simulate(schedule(name, 2), costs).makespan > 0  # every op has a time
        assert set(got) == set(ref_grads), name
        for key, ref in ref_grads.items():  # 3 steps accumulated, divided by 3
            torch.testing.assert_close(got[key], ref, rtol=1e-5, atol=1e-7, msg=f"{name} {key}")


def test_static_shapes_refuse_a_shape_that_changed():
    pairs = [batch(2, seq_len, seed=seq_len) for seq_len in (3, 7, 5, 9)]
    xs, ys = [p[0] for p in pairs], [p[1] for p in pairs]
    with pytest.raises(RankFailure, match=r"static_shapes: act of stage 1 microbatch 0 is "
                                          r"torch.float32 \(2, 11, \d+\), but was"):  # fmt: skip
        spawn(_static_rank, 2, args=(("zb-h1",), xs, ys, True), timeout_s=120)


def test_costs_from_op_times_fill_a_fused_only_stage_and_name_a_missing_one() -> None:
    medians = {("F", 0): 2.0, ("BW", 0): 6.0, ("F", 1): 3.0, ("B", 1): 4.0, ("W", 1): 1.0}
    costs = costs_from_op_times(medians, 2, t_comm=0.5)
    assert (costs.t_f, costs.t_b, costs.t_w) == ((2.0, 3.0), (3.0, 4.0), (3.0, 1.0))
    assert costs.t_bw == (6.0, 5.0) and costs.t_comm == 0.5
    with pytest.raises(ValueError, match="no F time for stage 2"):
        costs_from_op_times(medians, 3)
    with pytest.raises(ValueError, match="no backward time for stage 1"):
        costs_from_op_times({("F", 0): 1.0, ("BW", 0): 2.0, ("F", 1): 1.0}, 2)
