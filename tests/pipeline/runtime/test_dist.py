"""Every schedule on 2 and 4 gloo ranks equals the single-process model.

One spawn per world size runs all schedules (3 SGD steps each); the reference is the whole
model in this process with plain autograd (no B/W split) and gradient accumulation over the
same microbatches. Also: measured activation memory ranks schedules as the simulator does,
a failing rank stops the job with its error, bad input is rejected before processes start.
"""

from __future__ import annotations

import multiprocessing as mp
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from nobubble.distributed import RankFailure
from nobubble.pipeline.actions import Schedule
from nobubble.pipeline.costs import CostModel
from nobubble.pipeline.runtime.executor import TrainConfig
from nobubble.pipeline.runtime.launch import LaunchOptions, run_local
from nobubble.pipeline.runtime.models import GPTConfig, MLPConfig, build_blocks
from nobubble.pipeline.runtime.profile import profile_stages
from nobubble.pipeline.schedules import SCHEDULE_NAMES, get_schedule
from nobubble.pipeline.simulate import simulate
from nobubble.pipeline.validate import ScheduleError

pytestmark = pytest.mark.xdist_group("pipeline-dist")  # its module fixtures run once

MODEL = GPTConfig(vocab_size=32, seq_len=8, hidden=16, num_heads=2, num_layers=8, seed=5)
MLP_MODEL = MLPConfig(in_features=8, hidden=16, num_classes=5, num_layers=4, seed=6)
MICROBATCH_SIZE = 2
NUM_MICROBATCHES = 4
NUM_STEPS = 3
LR = 0.05
OPTIONS = LaunchOptions(timeout_s=150.0)


def torch_csv_schedule(num_ranks: int, path) -> Schedule:
    """torch.distributed.pipelining's own interleaved zero-bubble order, dumped by torch."""
    from torch.distributed.pipelining.schedules import ScheduleInterleavedZeroBubble

    v = 2
    stages = [
        SimpleNamespace(
            group_size=num_ranks,
            group_rank=0,
            num_stages=num_ranks * v,
            stage_index=k * num_ranks,
            submod=torch.nn.Linear(1, 1),
            is_first=k == 0,
            is_last=False,
        )  # fmt: skip
        for k in range(v)
    ]
    sched = ScheduleInterleavedZeroBubble(stages, n_microbatches=NUM_MICROBATCHES)
    sched._dump_csv(str(path), format="compute_only")
    return Schedule.from_csv(path.read_text(), name="torch-csv")


def configs(num_ranks: int, tmp_path, model=MODEL, names=SCHEDULE_NAMES) -> list[TrainConfig]:
    schedules = [
        get_schedule(
            n,
            num_stages=num_ranks,
            num_microbatches=NUM_MICROBATCHES,
            costs=CostModel.uniform(num_ranks),
        )
        for n in names
    ]
    if model is MODEL:
        schedules.append(torch_csv_schedule(num_ranks, tmp_path / f"torch_{num_ranks}.csv"))
    return [
        TrainConfig(
            model=model,
            schedule=s,
            microbatch_size=MICROBATCH_SIZE,
            num_steps=NUM_STEPS,
            lr=LR,
            collect_grads=True,
            collect_params=True,
        )  # fmt: skip
        for s in schedules
    ]


def reference_run(model):
    """Single process, plain autograd: step-0 gradients, per-step losses, final weights."""
    blocks = build_blocks(model)
    opt = torch.optim.SGD(blocks.parameters(), lr=LR, momentum=0.9)
    grads, losses = None, []
    for step in range(NUM_STEPS):
        batch = model.make_batch(MICROBATCH_SIZE * NUM_MICROBATCHES, seed=step)
        total = 0.0
        for mb in batch.split(NUM_MICROBATCHES):
            y = mb.inputs
            for blk in blocks.values():
                y = blk(y)
            loss = model.loss(y, mb.targets)
            total += float(loss.detach())
            (loss / NUM_MICROBATCHES).backward()
        if step == 0:
            grads = {n: p.grad.clone() for n, p in blocks.named_parameters()}
        losses.append(total / NUM_MICROBATCHES)
        opt.step()
        opt.zero_grad()
    params = {n: p.detach().clone() for n, p in blocks.named_parameters()}
    return grads, losses, params


@pytest.fixture(scope="module")
def reference():
    return {MODEL: reference_run(MODEL), MLP_MODEL: reference_run(MLP_MODEL)}


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    """{num_ranks: (configs, results[config][rank])}, one spawn per world size."""
    out = {}
    for p in (2, 4):
        cfgs = configs(p, tmp_path_factory.mktemp(f"p{p}"))
        if p == 2:  # the MLP too, in the same spawn
            cfgs += configs(2, None, model=MLP_MODEL, names=("1f1b", "zb-h2", "zb-v"))
        out[p] = (cfgs, run_local(cfgs, OPTIONS))
    return out


def _union(per_rank, attr):
    merged = {}
    for r in per_rank:
        part = getattr(r, attr)
        assert not set(part) & set(merged), "a parameter lives on two ranks"
        merged.update(part)
    return merged


@pytest.mark.parametrize("num_ranks", [2, 4])
def test_every_schedule_matches_single_process(results, reference, num_ranks):
    cfgs, res = results[num_ranks]
    assert len(cfgs) == len(SCHEDULE_NAMES) + 1 + (3 if num_ranks == 2 else 0)
    for cfg, per_rank in zip(cfgs, res, strict=True):
        ref_grads, ref_losses, ref_params = reference[cfg.model]
        name = f"{cfg.model.name} {cfg.schedule.name}"
        grads, params = _union(per_rank, "grads"), _union(per_rank, "params")
        assert set(grads) == set(ref_grads), name
        for n in ref_grads:
            torch.testing.assert_close(
                grads[n], ref_grads[n], rtol=1e-5, atol=1e-7, msg=f"{name}: grad {n}"
            )
            torch.testing.assert_close(
                params[n], ref_params[n], rtol=1e-5, atol=1e-7, msg=f"{name}: param {n}"
            )
        (losses,) = [r.losses for r in per_rank if r.losses is not None]
        torch.testing.assert_close(
            torch.tensor(losses), torch.tensor(ref_losses), rtol=1e-5, atol=0
        )
        ops = sum(1 for r in per_rank for e in r.events if e.cat != "wait")
        assert ops == NUM_STEPS * cfg.schedule.num_actions, name


def test_measured_peak_memory_ranks_schedules_like_the_simulator(results):
    cfgs, res = results[4]
    assert {c.model for c in cfgs} == {MODEL}
    profiles = {}
    measured, predicted = {}, {}
    for cfg, per_rank in zip(cfgs, res, strict=True):
        s = cfg.schedule
        if s.num_stages not in profiles:
            profiles[s.num_stages] = profile_stages(
                MODEL, s.num_stages, microbatch_size=MICROBATCH_SIZE, repeats=1, warmup=0
            )
        sim = simulate(s, profiles[s.num_stages].cost_model(s))
        for r in range(s.num_ranks):
            measured[s.name, r] = per_rank[r].peak_activation_bytes
            predicted[s.name, r] = sim.peak_memory[r]
    names = [c.schedule.name for c in cfgs]
    checked = 0
    for r in range(4):
        for a in names:
            for b in names:
                pa, pb = predicted[a, r], predicted[b, r]
                if pa < 0.95 * pb:  # the simulator says a needs clearly less than b
                    assert measured[a, r] < measured[b, r], (r, a, b, measured, predicted)
                    checked += 1
    assert checked > 20  # the schedules do differ in memory


def test_failing_rank_stops_every_rank_with_its_error():
    sched = get_schedule("zb-h1", num_stages=2, num_microbatches=NUM_MICROBATCHES)
    cfg = TrainConfig(model=MODEL, schedule=sched, fail_at="1:1F2")
    # the error names the failing rank's own exception, not the launcher's timeout
    with pytest.raises(RankFailure, match="rank 1 failed: RuntimeError: injected failure"):
        run_local([cfg], LaunchOptions(timeout_s=150.0))
    assert not [p for p in mp.active_children() if p.is_alive()]


def test_bad_schedule_and_model_mismatch_rejected_before_spawn():
    missing_w = Schedule.from_csv("0F0,0I0\n1F0,1I0,1W0\n")
    cfg = TrainConfig(model=MODEL, schedule=missing_w)
    with pytest.raises(ScheduleError, match="0W0|W of stage 0"):
        run_local([cfg])
    too_many = get_schedule("zb-v", num_stages=8, num_microbatches=8)  # 16 stages, 8 layers
    with pytest.raises(ValueError, match="8 layers but the schedule has 16 stages"):
        run_local([TrainConfig(model=MODEL, schedule=too_many)])
    ok = TrainConfig(model=MODEL, schedule=get_schedule("1f1b", num_stages=2, num_microbatches=2))
    if torch.cuda.device_count() < 2:
        with pytest.raises(ValueError, match="has no CUDA|sees no GPU|2 ranks need 2 GPUs"):
            run_local([ok], LaunchOptions(device="cuda"))
    assert not mp.active_children()


def test_outside_torchrun_the_traced_run_is_a_value_error_before_any_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``run_torchrun_traced`` without torchrun's environment names the missing variable and
    claims no trace file (it was a KeyError)."""
    from nobubble.distributed.options import LaunchOptions
    from nobubble.pipeline.runtime.launch import run_torchrun_traced

    for var in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(var, raising=False)
    with pytest.raises(
        ValueError, match="run_torchrun_traced: RANK is not set; launch with torchrun"
    ):
        run_torchrun_traced(None, LaunchOptions(), tmp_path / "t.json")  # type: ignore[arg-type]
    assert list(tmp_path.iterdir()) == []
