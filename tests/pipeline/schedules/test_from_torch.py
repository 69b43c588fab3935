"""Schedules written by torch.distributed.pipelining import, validate and simulate; ours
load back into torch."""

from __future__ import annotations

import pytest
import torch
from torch.distributed.pipelining import schedules as torch_schedules

from nobubble.pipeline.actions import Schedule
from nobubble.pipeline.costs import CostModel
from nobubble.pipeline.schedules import get_schedule
from nobubble.pipeline.schedules.from_torch import _StageInfo, torch_schedule
from nobubble.pipeline.simulate import simulate
from nobubble.pipeline.validate import validate


def _torch_object(cls_name: str, p: int, m: int, stage_ids: list[int]):
    stages = [_StageInfo(s, 2 * p, p, 0, submod=torch.nn.Identity()) for s in stage_ids]
    return getattr(torch_schedules, cls_name)(stages, m)


@pytest.mark.parametrize(
    ("cls_name", "stage_ids"),
    [("ScheduleInterleavedZeroBubble", [0, 4]), ("ScheduleZBVZeroBubble", [0, 7]),
     ("ScheduleDualPipeV", [0, 7])],
)  # fmt: skip
def test_torch_written_csv_imports_validates_simulates(tmp_path, cls_name, stage_ids):
    p, m = 4, 8
    path = tmp_path / "torch.csv"
    obj = _torch_object(cls_name, p, m, stage_ids)
    if "format" in obj._dump_csv.__code__.co_varnames:
        obj._dump_csv(str(path), format="compute_only")
    else:
        obj._dump_csv(str(path))
    sched = Schedule.from_csv(path.read_text(), name=cls_name)
    validate(sched)
    assert (sched.num_ranks, sched.num_chunks, sched.num_microbatches) == (4, 2, 8)
    assert sched.stage_to_rank == tuple(obj.stage_index_to_group_rank[s] for s in range(2 * p))
    result = simulate(sched, CostModel.uniform(p, t_f=1.0, t_b=1.0, t_w=1.0))
    # every rank computes m * (F + B + W) of its two half-size chunks
    assert result.busy == pytest.approx((m * 3.0,) * p)
    assert 0.0 <= result.bubble_rate < 0.1


def test_torch_zbv_order_equals_ours():
    """Two independent writings of the paper's ZB-V produce the same per-rank orders."""
    for p, m in [(2, 1), (3, 5), (4, 8), (8, 24)]:
        theirs = torch_schedule("torch-zbv", num_stages=p, num_microbatches=m)
        ours = get_schedule("zb-v", num_stages=p, num_microbatches=m)
        assert theirs.rank_actions == ours.rank_actions
        assert theirs.stage_to_rank == ours.stage_to_rank


def test_our_csv_loads_into_torch(tmp_path):
    ours = get_schedule("zb-v", num_stages=4, num_microbatches=8)
    path = tmp_path / "ours.csv"
    path.write_text(ours.to_csv())
    obj = _torch_object("ScheduleZBVZeroBubble", 4, 8, [0, 7])
    obj._load_csv(str(path))
    for rank, acts in enumerate(ours.rank_actions):
        assert [str(a) for a in obj.pipeline_order[rank] if a is not None] == [str(a) for a in acts]


def test_torch_1f1b_visual_order_is_rejected_with_reason():
    """torch's Schedule1F1B._get_pipeline_order (2.13) numbers the last rank's forwards from 1;
    the import names the bad action instead of simulating nonsense."""
    try:
        sched = torch_schedule("torch-1f1b", num_stages=4, num_microbatches=8)
    except ValueError as err:
        assert "3F8" in str(err)
    else:  # a fixed torch: then it must be a valid 1F1B
        validate(sched)
