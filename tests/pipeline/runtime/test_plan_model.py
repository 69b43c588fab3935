"""plan() on the user's own modules: the profile per block, the refusals, the cut following the
costs, the stages holding the user's modules, and the example a user runs."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from torch import nn

from nobubble.pipeline import split_model
from nobubble.pipeline.plan import Plan
from nobubble.pipeline.runtime.planning import (
    PlanRun,
    RuntimeCosts,
    measure_runtime,
    plan,
    plan_model,
    profile_blocks,
)

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"
WIDTH, SEQ, NUM_BLOCKS = 256, 128, 6


@pytest.fixture(autouse=True)
def one_thread() -> Iterator[None]:
    """One intra-op thread: timings on a shared 2-core machine are steadier."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def mlp_block(hidden: int) -> nn.Module:
    """(B, T, WIDTH) -> (B, T, WIDTH); compute grows linearly with ``hidden``."""
    return nn.Sequential(nn.Linear(WIDTH, hidden), nn.GELU(), nn.Linear(hidden, WIDTH))


def model(heavy: int | None = None) -> list[nn.Module]:
    """NUM_BLOCKS blocks of width WIDTH; block ``heavy`` (if any) is 3x wider inside."""
    torch.manual_seed(0)
    return [mlp_block(3 * WIDTH if i == heavy else WIDTH) for i in range(NUM_BLOCKS)]


def batch(rows: int = 16) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return torch.randn(rows, SEQ, WIDTH, generator=g), torch.randn(rows, SEQ, WIDTH, generator=g)


class Pair(nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return x, x


def test_profile_blocks_gives_each_block_its_costs() -> None:
    x, _ = batch(2)
    costs = profile_blocks(model(), x, repeats=2)
    assert len(costs) == NUM_BLOCKS
    for c in costs:
        assert c.forward > 0 and c.backward_input + c.backward_weight > 0
        assert c.boundary_bytes == x.numel() * 4  # fp32 (2, SEQ, WIDTH) out of every block
        assert c.activation_bytes > 0


def test_a_block_returning_a_tuple_is_refused_before_profiling(monkeypatch) -> None:
    import nobubble.pipeline.runtime.profile as prof

    def no_timing(*args, **kwargs):
        raise AssertionError("profiled before checking the outputs")

    monkeypatch.setattr(prof, "_time_module", no_timing)
    blocks = [*model()[:2], Pair(), *model()[2:]]
    x, y = batch()
    with pytest.raises(ValueError, match=r"block 2 \(Pair\) returns a tuple"):
        profile_blocks(blocks, x)
    with pytest.raises(ValueError, match=r"block 2 \(Pair\) returns a tuple"):
        plan(blocks, x, y, nn.functional.mse_loss, num_ranks=2)


@pytest.mark.parametrize(
    ("blocks", "num_ranks", "rows", "message"),
    [
        ([], 1, 16, "no blocks"),
        (None, 7, 16, "num_ranks=7 for 6 blocks"),
        (None, 0, 16, "num_ranks=0 for 6 blocks"),
        (None, 2, 11, "batch_size=11 has no divisor"),
    ],
)
def test_plan_refuses_bad_input_before_profiling(monkeypatch, blocks, num_ranks, rows, message):
    import nobubble.pipeline.runtime.planning.model as pm

    monkeypatch.setattr(pm, "profile_blocks", lambda *a, **k: pytest.fail("profiled"))
    x, y = batch(rows)
    with pytest.raises(ValueError, match=message):
        plan(model() if blocks is None else blocks, x, y, nn.functional.mse_loss,
             num_ranks=num_ranks)  # fmt: skip


def test_plan_refuses_a_microbatch_count_that_does_not_divide_the_batch() -> None:
    x, y = batch(16)
    with pytest.raises(ValueError, match=r"batch_size=16 is not divisible .*\[3\]"):
        plan(model(), x, y, nn.functional.mse_loss, num_ranks=2, num_microbatches=3)


def one_f_one_b_cut(blocks: list[nn.Module]) -> int:
    x, y = batch()
    p = plan(blocks, x, y, nn.functional.mse_loss, num_ranks=2, num_microbatches=4,
             schedules=["1f1b"], recompute=False)  # fmt: skip
    return p.cuts[0]


@pytest.mark.long  # the cut follows measured times: a busy machine moves it
def test_the_cut_moves_toward_a_block_made_3x_wider() -> None:
    uniform = one_f_one_b_cut(model())
    # the last block 3x wider weighs about as much as two others: the cut moves toward it
    assert one_f_one_b_cut(model(heavy=NUM_BLOCKS - 1)) > uniform
    # block 1 3x wider (block 0 is the lightest: its input needs no gradient) leaves stage 0
    # near half the step with one block fewer or the same: cuts (2,) and (3,) predict within
    # a few percent of each other, so only "not away from it" is robust to timing noise
    assert one_f_one_b_cut(model(heavy=1)) <= uniform


def test_stages_hold_the_users_own_modules_and_the_plan_round_trips() -> None:
    blocks = model()
    x, y = batch()
    p = plan(blocks, x, y, nn.functional.mse_loss, num_ranks=2, num_microbatches=[2, 4])
    stages = split_model(blocks, p.num_stages, balance=p)
    assert [len(s) for s in stages] == list(p.stage_sizes())
    assert [m for s in stages for m in s] == blocks
    assert all(a is b for a, b in zip((m for s in stages for m in s), blocks, strict=True))
    assert (p.setting.microbatch_size, p.setting.batch_size) == (4, 16)  # the smaller one profiled
    again = Plan.from_json(p.to_json())
    assert again == p and again.schedule() == p.schedule()
    assert p.schedule().num_microbatches == p.num_microbatches
    with pytest.raises(ValueError, match=rf"cuts 6 blocks into {p.num_stages} stages, not 3"):
        split_model(blocks[:3], 2, balance=p)


def test_the_example_plans_and_runs() -> None:
    cmd = [sys.executable, str(EXAMPLES / "plan_own_model.py")]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert re.search(r"plan: cuts \([\d, ]+\), [\w-]+, \d+ microbatches, recompute \w+, "
                     r"predicted step [\d.]+ ms", out.stdout), out.stdout  # fmt: skip
    assert re.search(r"ran the plan on 2 ranks: loss [\d.]+", out.stdout), out.stdout


def test_the_runtime_probe_measures_a_cost_per_action_and_per_byte() -> None:
    costs = measure_runtime(2, (4, 64), steps=3)
    assert 0 < costs.op_overhead_ms < 1e3 and costs.comm_ms_per_byte >= 0
    with pytest.raises(ValueError, match="num_ranks=1; a pipeline needs >= 2"):
        measure_runtime(1)
    with pytest.raises(ValueError, match=r"boundary_shape=\(\)"):
        measure_runtime(2, ())


class ThreadsSeen(nn.Module):
    """A block that records the intra-op thread count each forward runs with."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(WIDTH, WIDTH)
        self.seen: list[int] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.seen.append(torch.get_num_threads())
        return self.linear(x)


def test_plan_model_plans_with_the_given_runtime_costs_and_threads() -> None:
    blocks = [ThreadsSeen(), *model()[1:]]
    x, y = batch()
    phases: list[str] = []
    given = RuntimeCosts(op_overhead_ms=0.25, comm_ms_per_byte=3e-7)
    p = plan_model(blocks, x, y, nn.functional.mse_loss, num_ranks=2, num_microbatches=4,
                   runtime=given, threads=2, progress=phases.append)  # fmt: skip
    assert (p.setting.op_overhead_ms, p.setting.comm_ms_per_byte) == (0.25, 3e-7)
    assert (p.setting.batch_size, p.setting.microbatch_size) == (16, 4)
    assert blocks[0].seen and set(blocks[0].seen) == {2}  # profiled with 2 threads
    assert torch.get_num_threads() == 1  # the fixture's count, restored
    assert phases == ["profiling 6 blocks, planning 2 ranks"]  # given costs: nothing measured
    one = plan_model(model(), x, y, nn.functional.mse_loss, num_ranks=1, num_microbatches=4)
    assert (one.setting.op_overhead_ms, one.setting.comm_ms_per_byte) == (0.0, 0.0)


def test_plan_model_measures_the_runtime_on_a_microbatchs_boundary(monkeypatch) -> None:
    import nobubble.pipeline.runtime.planning.model as pm

    shapes = []

    def recording(num_ranks, boundary_shape, **kwargs):
        shapes.append((num_ranks, tuple(boundary_shape)))
        return measure_runtime(num_ranks, boundary_shape, **kwargs)

    monkeypatch.setattr(pm, "measure_runtime", recording)
    blocks = [nn.Linear(WIDTH, 8), nn.Linear(8, WIDTH)]  # the boundary is (rows, SEQ, 8)
    x, y = batch()
    phases: list[str] = []
    p = plan_model(blocks, x, y, nn.functional.mse_loss, num_ranks=2, num_microbatches=8,
                   progress=phases.append)  # fmt: skip
    assert shapes == [(2, (2, SEQ, 8))]  # 16 rows / 8 microbatches
    assert 0 < p.setting.op_overhead_ms < 1e3 and p.setting.comm_ms_per_byte >= 0
    assert phases == ["measuring the runtime's cost on 2 ranks",
                      "profiling 2 blocks, planning 2 ranks"]  # fmt: skip
    with pytest.raises(ValueError, match="num_ranks=3 for 2 blocks"):
        plan_model(blocks, x, y, nn.functional.mse_loss, num_ranks=3)
    assert len(shapes) == 1  # refused before measuring


@pytest.mark.parametrize(
    ("parts", "message"),
    [
        (({"a": nn.Linear(2, 2)}, torch.zeros(4, 2)), "blocks: a dict; give a non-empty list"),
        (([], torch.zeros(4, 2)), "blocks: no blocks"),
        ((torch.zeros(3, 2), torch.zeros(4, 2)), "blocks: a Tensor; give a non-empty list"),
        ((0, torch.zeros(4, 2)), "blocks: a int; give a non-empty list"),
        (([nn.Linear(2, 2), "relu"], torch.zeros(4, 2)), "block 1 is a str; give an nn.Module"),
        (([nn.Linear(2, 2)], [[0.0, 0.0]]), "inputs: a list; give the batch as a tensor"),
    ],
)
def test_a_user_model_refuses_parts_that_are_not_a_model(parts, message) -> None:
    from nobubble.pipeline.runtime.planning import UserModel

    with pytest.raises(ValueError, match=re.escape(message)):
        UserModel(*parts, torch.zeros(4), nn.functional.mse_loss)
    with pytest.raises(ValueError, match=re.escape("loss_fn: a str; give a function")):
        UserModel([nn.Linear(2, 2)], torch.zeros(4, 2), torch.zeros(4), "mse")


def test_a_user_model_refuses_a_plan_made_for_another_model() -> None:
    from nobubble.pipeline.plan import BlockCosts, plan_from_costs
    from nobubble.pipeline.runtime.planning import UserModel

    costs = BlockCosts(forward=1.0, backward_input=1.0, backward_weight=1.0,
                       activation_bytes=1e3, boundary_bytes=1e2)  # fmt: skip
    p = plan_from_costs([costs] * 4, num_ranks=2, num_microbatches=4)
    blocks = [nn.Linear(2, 2) for _ in range(4)]
    UserModel(blocks, torch.zeros(8, 2), torch.zeros(8, 2), nn.functional.mse_loss).check_plan(p)
    with pytest.raises(ValueError, match="a plan for 4 blocks, but the model returns 3"):
        UserModel(blocks[:3], torch.zeros(8, 2), None, nn.functional.mse_loss).check_plan(p)
    with pytest.raises(ValueError, match="a batch of 6 rows does not split into the plan's 4"):
        UserModel(blocks, torch.zeros(6, 2), None, nn.functional.mse_loss).check_plan(p)


def test_a_user_model_from_a_factory_is_seeded_and_checked() -> None:
    """Two builds with one seed hold the same weights (every rank builds the model so); a
    factory that is no function, raises or returns no 4 parts is one ValueError naming what
    it did."""
    from nobubble.pipeline.runtime.planning import UserModel

    def factory():
        return [nn.Linear(2, 2)], torch.zeros(4, 2), torch.zeros(4, 2), nn.functional.mse_loss

    first, again = (UserModel.from_factory(factory, seed=3) for _ in range(2))
    other = UserModel.from_factory(factory, seed=4)
    assert torch.equal(first.blocks[0].weight, again.blocks[0].weight)
    assert not torch.equal(first.blocks[0].weight, other.blocks[0].weight)
    with pytest.raises(ValueError, match="the factory returned a tuple of 3; return"):
        UserModel.from_factory(lambda: factory()[:3])
    with pytest.raises(ValueError, match="the factory raised KeyError: 'x'"):
        UserModel.from_factory(lambda: {}["x"])
    with pytest.raises(ValueError, match="blocks: no blocks"):
        UserModel.from_factory(lambda: ([], *factory()[1:]))
    with pytest.raises(ValueError, match=r"the factory is not a function \(its type is int\)"):
        UserModel.from_factory(7)  # type: ignore[arg-type]


def test_a_plan_runs_median_step_leaves_the_warm_up_step_out_unless_alone() -> None:
    # step times 100 (warm-up), then 2, 4, 9: the median of the last three is 4
    assert PlanRun(losses=(1.0,) * 4, step_ms=(100.0, 2.0, 4.0, 9.0)).median_step_ms == 4.0
    assert PlanRun(losses=(1.0,), step_ms=(7.0,)).median_step_ms == 7.0
