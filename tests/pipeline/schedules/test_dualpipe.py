"""DualPipe and DualPipeV: valid for every size, equal to torch's ``ScheduleDualPipeV``
(cells included), the memory DeepSeek publishes, and DualPipe's fold checked against an
independent run of its two pipelines.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nobubble.pipeline.actions import Action, Op, Schedule
from nobubble.pipeline.costs import CostModel
from nobubble.pipeline.schedules import get_schedule
from nobubble.pipeline.schedules.dualpipe import (
    DualPipe,
    OverlappedSchedule,
    dualpipe,
    dualpipev,
)
from nobubble.pipeline.schedules.from_torch import available_torch_schedules, torch_schedule
from nobubble.pipeline.schedules.v_shape import v_stage_to_rank
from nobubble.pipeline.simulate import simulate
from nobubble.pipeline.validate import validate


def _held(actions: tuple[Action, ...]) -> int:
    """Most chunk-microbatches a rank holds at once: from its F until its W (or BW) ran."""
    live = peak = 0
    for a in actions:
        live += 1 if a.op is Op.F else (-1 if a.op in (Op.W, Op.BW) else 0)
        peak = max(peak, live)
    return peak


@settings(max_examples=120, deadline=None)
@given(st.integers(1, 12), st.integers(1, 64))
def test_dualpipev_is_valid_and_its_cells_are_f_and_fused_b_of_both_chunks(p, m):
    dp = dualpipev(p, m)
    sched = dp.schedule
    validate(sched)
    assert (sched.num_ranks, sched.num_stages, sched.num_microbatches) == (p, 2 * p, m)
    assert sched.stage_to_rank == v_stage_to_rank(p)
    assert get_schedule("dualpipev", num_ranks=p, num_microbatches=m) == sched
    for rank in range(p):
        cells = dp.cells(rank)
        assert [a for c in cells for a in c] == list(sched.rank_actions[rank])
        for cell in (c for c in cells if len(c) == 2):
            f, b = cell
            assert f.op is Op.F and b.op is Op.BW  # the overlapped backward is fused
            assert {f.stage, b.stage} == set(sched.stages_of(rank))
    # the torch CSV with OVERLAP_F_B cells reads back as the same schedule
    assert Schedule.from_csv(dp.to_torch_csv(), name="dualpipev") == sched


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 12), st.integers(1, 64))
def test_dualpipev_holds_deepseeks_2p_plus_1_chunk_activations(p, m):
    """DeepSeek's table: DualPipeV holds PP + 1 stages' activations per device (PP = 2p
    stages); recounted here from the order alone, and the simulator's peak agrees."""
    sched = dualpipev(p, m).schedule
    held = [_held(acts) for acts in sched.rank_actions]
    if m >= 2 * p:
        assert held == [2 * p + 1] * p
    assert max(held) <= 2 * p + 1
    # per stage: F stores 1, B frees 0 (all held until W): the simulator's peak is the count
    costs = CostModel.uniform(2 * p, mem_f=1.0, mem_b=0.0, mem_w=1.0)
    assert list(simulate(sched, costs).peak_memory) == pytest.approx(held)


_needs_torch = pytest.mark.skipif(
    "torch-dualpipev" not in available_torch_schedules(), reason="no ScheduleDualPipeV"
)


def _torch_cells_csv(p: int, m: int) -> str:
    """torch's DualPipeV order as CSV, each ``OVERLAP_F_B`` action one cell."""
    from torch.distributed.pipelining.schedules import ScheduleDualPipeV
    from torch.nn import Identity

    from nobubble.pipeline.schedules.from_torch import _StageInfo

    stages = [_StageInfo(s, 2 * p, p, 0, submod=Identity()) for s in (0, 2 * p - 1)]
    order = ScheduleDualPipeV(stages, m).pipeline_order
    return "".join(",".join(str(a) for a in order[r] if a is not None) + "\n" for r in range(p))


@_needs_torch
@pytest.mark.parametrize(("p", "m"), [(1, 2), (2, 4), (2, 7), (3, 6), (4, 8), (4, 13), (8, 24)])
def test_dualpipev_equals_torchs_order_and_cells(p, m):
    ours = dualpipev(p, m)
    theirs = torch_schedule("torch-dualpipev", num_stages=p, num_microbatches=m)
    assert ours.schedule.rank_actions == theirs.rank_actions
    assert ours.to_torch_csv() == _torch_cells_csv(p, m)


@_needs_torch
def test_below_2p_microbatches_torch_refuses_and_ours_drops_the_missing_ones():
    with pytest.raises(ValueError, match="at least as many microbatches as stages"):
        torch_schedule("torch-dualpipev", num_stages=4, num_microbatches=7)
    validate(dualpipev(4, 7).schedule)


def test_bad_sizes_are_refused_with_the_fix():
    with pytest.raises(ValueError, match="num_ranks=0 must be an integer >= 1"):
        dualpipev(0, 4)
    with pytest.raises(ValueError, match="num_ranks=3: use 4 ranks, or dualpipev"):
        dualpipe(3, 6)
    with pytest.raises(ValueError, match="num_microbatches=7 is odd: use 8"):
        dualpipe(4, 7)
    with pytest.raises(ValueError, match="dualpipev always has 2 chunks"):
        get_schedule("dualpipev", num_ranks=2, num_microbatches=4, num_chunks=3)
    sched = dualpipev(2, 4).schedule
    with pytest.raises(ValueError, match="a cell is an F followed by a backward"):
        OverlappedSchedule(sched, ((0,), ()))  # 0F0 then 0F1
    with pytest.raises(ValueError, match="overlaps the previous cell"):
        OverlappedSchedule(sched, ((7, 8), ()))


# -- DualPipe: two pipelines, checked by a run of its own dependencies ----------------------


def _run_two_pipelines(dp: DualPipe, *, t_f: float, t_b: float, t_w: float, t_comm: float):
    """Step time of DualPipe's real order: each direction a chain of p stages (forward: stage
    s on rank s; reverse: on rank p-1-s); ranks run their order, an input from another rank
    arrives t_comm after it is made. Returns None on a deadlock."""
    p = dp.num_ranks
    rank_of = {"forward": lambda s: s, "reverse": lambda s: p - 1 - s}
    duration = {Op.F: t_f, Op.B: t_b, Op.W: t_w, Op.BW: t_b + t_w}
    done: dict[tuple, tuple[float, int]] = {}  # (direction, kind, stage, mb) -> (end, rank)

    def needs(d, a):
        s, i = a.stage, a.microbatch
        if a.op is Op.F:
            return [(d, "F", s - 1, i)] if s > 0 else []
        if a.op is Op.W:
            return [(d, "B", s, i)]
        return [(d, "F", s, i)] + ([(d, "B", s + 1, i)] if s < p - 1 else [])

    pos, free = [0] * p, [0.0] * p
    progress = True
    while progress:
        progress = False
        for r in range(p):
            while pos[r] < len(dp.order[r]):
                d, a = dp.order[r][pos[r]]
                deps = needs(d, a)
                if any(k not in done for k in deps):
                    break
                start = max([free[r]] + [e + (t_comm if q != r else 0.0)
                                         for e, q in (done[k] for k in deps)])  # fmt: skip
                free[r] = start + duration[a.op]
                kind = "F" if a.op is Op.F else ("W" if a.op is Op.W else "B")
                done[(d, kind, a.stage, a.microbatch)] = (free[r], rank_of[d](a.stage))
                pos[r] += 1
                progress = True
    if any(pos[r] < len(dp.order[r]) for r in range(p)):
        return None
    return max(free)


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 6), st.integers(1, 24))
def test_dualpipe_runs_both_pipelines_and_matches_its_fold(half_p, half_m):
    p, m = 2 * half_p, 2 * half_m
    dp = dualpipe(p, m)
    for direction in ("forward", "reverse"):
        validate(dp.pipeline(direction))
    for r in range(p):  # a cell pairs an F of one direction with a BW of the other
        for k in dp.pairs[r]:
            (d0, f), (d1, b) = dp.order[r][k], dp.order[r][k + 1]
            assert f.op is Op.F and b.op is Op.BW and d0 != d1
    step = _run_two_pipelines(dp, t_f=1.0, t_b=1.5, t_w=0.7, t_comm=0.0)
    assert step is not None, "DualPipe's order deadlocks"
    folded = simulate(dp.folded.schedule, CostModel.uniform(p, t_f=1.0, t_b=1.5, t_w=0.7))
    assert step == pytest.approx(folded.makespan)
    # a transfer at the middle: the fold (local there) can only be faster
    comm = CostModel.uniform(p, t_f=1.0, t_b=1.5, t_w=0.7, t_comm=0.3)
    slow = _run_two_pipelines(dp, t_f=1.0, t_b=1.5, t_w=0.7, t_comm=0.3)
    assert slow is not None and simulate(dp.folded.schedule, comm).makespan <= slow + 1e-9


def test_dualpipe_fold_is_close_on_a_paper_configuration():
    """1.5B costs, P=8, M=24: the middle transfers the fold leaves out cost under 1%."""
    dp = dualpipe(8, 24)
    times = {"t_f": 18.522, "t_b": 18.086, "t_w": 9.337}
    exact = _run_two_pipelines(dp, **times, t_comm=0.601)
    folded = simulate(dp.folded.schedule, CostModel.uniform(8, **times, t_comm=0.601))
    assert exact is not None and folded.makespan <= exact <= folded.makespan * 1.01
