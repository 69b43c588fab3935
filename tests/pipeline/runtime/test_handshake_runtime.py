"""``PipelineRunner(dispatch="handshake")``: the rule at run time, against one process.

In one process: every rank's :class:`PlanCursor` driven by random arrival orders (the rule
never sticks, the order it runs validates, the level stays within the plan's peak). On 2 and
4 gloo ranks: the loss and every gradient equal one process running the whole model (fp32,
rtol 1e-5) for zb-h1 and zb-2p, with and without a real straggler, and the order each rank
ran (``runner.last_order``) is a valid schedule.
"""

from __future__ import annotations

import random

import pytest
import torch

from nobubble.distributed import spawn
from nobubble.pipeline import CostModel, get_schedule
from nobubble.pipeline.actions import Schedule
from nobubble.pipeline.dispatch.perturb import Straggler
from nobubble.pipeline.reference import reference_step
from nobubble.pipeline.runtime.channel import MessageKey, outgoing
from nobubble.pipeline.runtime.cursor import PlanCursor, plan_levels
from nobubble.pipeline.runtime.hooks import StragglerObserver
from nobubble.pipeline.runtime.runner import PipelineRunner
from nobubble.pipeline.validate import validate
from tests.pipeline.runtime.torch_model import batch, loss_fn, stages

NAMES = ("zb-h1", "zb-2p")
NUM_MB = 4


def _drive(plan: Schedule, seed: int) -> Schedule:
    """Every rank's cursor in one process; a random rank moves, messages land late at random."""
    rng = random.Random(seed)
    cursors = [PlanCursor(plan, r) for r in range(plan.num_ranks)]
    in_flight: list[tuple[MessageKey, int]] = []  # sent, not yet arrived
    mailbox: set[tuple[MessageKey, int]] = set()
    order: list[list] = [[] for _ in cursors]
    while not all(c.progress.finished for c in cursors):
        if in_flight and rng.random() < 0.5:
            mailbox.add(in_flight.pop(rng.randrange(len(in_flight))))
            continue
        moves = [(r, k) for r, c in enumerate(cursors) if not c.progress.finished
                 for k in [c.choose(lambda key, src, r=r: (key, r) in mailbox)] if k is not None]  # fmt: skip
        assert moves or in_flight, "stuck: no rank can run and nothing is on the way"
        if not moves:
            continue
        r, k = rng.choice(moves)
        a = cursors[r].commit(k)
        assert cursors[r].level <= plan_levels(plan)[r]
        order[r].append(a)
        out = outgoing(plan, a)
        if out is not None and out[1] != r:
            in_flight.append((out[0], out[1]))
    return Schedule(f"{plan.name}+run", plan.num_microbatches, plan.stage_to_rank,
                    tuple(map(tuple, order)))  # fmt: skip


@pytest.mark.parametrize("name", ["1f1b", "zb-h1", "zb-h2", "zb-2p", "zb-v", "interleaved-1f1b"])
@pytest.mark.parametrize("num_ranks", [2, 3, 4])
def test_cursors_never_stick_and_run_valid_orders(name: str, num_ranks: int) -> None:
    for num_mb in (1, 2, 4, 6, 12):
        if name == "interleaved-1f1b" and num_mb % num_ranks:
            continue  # it needs m divisible by p
        plan = get_schedule(
            name, num_ranks=num_ranks, num_microbatches=num_mb, costs=CostModel.uniform(num_ranks)
        )
        for seed in range(5):
            validate(_drive(plan, seed))


def test_cursor_rule_prefers_head_then_b_then_next_f_then_w() -> None:
    plan = get_schedule("zb-h1", num_ranks=2, num_microbatches=4)
    cursor = PlanCursor(plan, 0)
    assert cursor.choose(lambda key, src: False) == 0  # F0 of stage 0 needs nothing
    with pytest.raises(ValueError, match="below the peak"):
        PlanCursor(plan, 0, limit=0)


def _handshake_rank(ctx, xs: list, ys: list, straggler: Straggler | None) -> dict:
    out = {}
    for name in NAMES:
        sched = get_schedule(name, num_ranks=ctx.world_size, num_microbatches=NUM_MB)
        slow = [StragglerObserver(straggler)] if straggler is not None else []
        runner = PipelineRunner(stages(sched.num_stages), sched, loss_fn, dispatch="handshake",
                                observer=slow)  # fmt: skip
        loss = runner.step(list(xs), list(ys))
        grads = {f"{s}.{n}": p.grad.clone() for s, m in runner.stage_modules.items()
                 for n, p in m.named_parameters()}  # fmt: skip
        out[name] = (float(loss), grads, runner.last_order)
        runner.close()
    return out


@pytest.mark.parametrize(("num_ranks", "straggler"), [(2, None), (4, Straggler(1, 3.0))])
def test_handshake_matches_one_process(num_ranks: int, straggler: Straggler | None) -> None:
    x, y = batch(8, 6)
    xs, ys = list(x.chunk(NUM_MB)), list(y.chunk(NUM_MB))
    results = spawn(_handshake_rank, num_ranks, args=(xs, ys, straggler), timeout_s=240)
    for name in NAMES:
        plan = get_schedule(
            name, num_ranks=num_ranks, num_microbatches=NUM_MB, costs=CostModel.uniform(num_ranks)
        )
        ref_loss, ref_grads = reference_step(stages(plan.num_stages), xs, ys, loss_fn)
        got: dict[str, torch.Tensor] = {}
        for r in results:
            assert r[name][0] == pytest.approx(ref_loss, rel=1e-6), name
            got.update(r[name][1])
        assert set(got) == set(ref_grads), name
        for key, ref in ref_grads.items():
            torch.testing.assert_close(got[key], ref, rtol=1e-5, atol=1e-7, msg=f"{name} {key}")
        ran = Schedule(f"{name}+handshake", NUM_MB, plan.stage_to_rank,
                       tuple(r[name][2] for r in results))  # fmt: skip
        validate(ran)


def test_unknown_dispatch_is_refused() -> None:
    plan = get_schedule("zb-h1", num_ranks=2, num_microbatches=2)
    with pytest.raises(ValueError, match="dispatch='eager'"):
        PipelineRunner(stages(2), plan, loss_fn, dispatch="eager")
