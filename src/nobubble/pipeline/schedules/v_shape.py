"""ZB-V: the Zero Bubble paper's V-shaped schedule (section 6), two chunks per rank.

The model is cut into 2p stages; rank r holds stage r (chunk 0, on the way down) and stage
2p-1-r (chunk 1, on the way back up), so the last stage sits on rank 0 next to the first and
the gradient turns around on rank 0 without a transfer. With T_F = T_B = T_W and T_comm = 0
it has no bubble after warm-up at 1F1B's activation memory (each rank holds at most p
microbatches' worth, counted in whole-rank activations).

Per rank r, written as the phases the paper draws (chunk 0 = ``down``, chunk 1 = ``up``):

1. warm-up: ``2(p - r) - 1`` forwards of chunk 0; then r pairs (F up, F down); then
   ``p - r`` rounds of (F up, B up, W up);
2. steady: rounds of (F down if any left, B down, W down, F up, B up, W up) until every
   microbatch has gone through both chunks' forward;
3. cool-down: r pairs of (B down, B up) with their Ws deferred, then ``p - r`` rounds of
   (B down, W down); the deferred Ws of chunk 1 then chunk 0 close the step.

Below m = 2p - 1 microbatches the phases are laid out for 2p - 1 and the actions of the
missing microbatches dropped (dependencies stay within a microbatch, so the order remains
valid).
"""

from __future__ import annotations

from nobubble.pipeline.actions import Action, Op, Schedule
from nobubble.pipeline.schedules.handwritten import check_sizes

__all__ = ["zb_v", "v_stage_to_rank"]


def v_stage_to_rank(num_ranks: int) -> tuple[int, ...]:
    """Stage s -> rank for the V shape: 0, 1, ..., p-1, p-1, ..., 1, 0."""
    p = num_ranks
    return tuple(range(p)) + tuple(range(p - 1, -1, -1))


class _Rank:
    """Counters of one rank's two chunks while its order is written out."""

    def __init__(self, p: int, r: int):
        self.stage = (r, 2 * p - 1 - r)
        self.next = {(c, op): 0 for c in (0, 1) for op in (Op.F, Op.B, Op.W)}
        self.order: list[Action] = []

    def run(self, chunk: int, op: Op) -> None:
        i = self.next[(chunk, op)]
        self.next[(chunk, op)] = i + 1
        self.order.append(Action(self.stage[chunk], op, i))

    def count(self, chunk: int, op: Op) -> int:
        return self.next[(chunk, op)]


def _rank_order(p: int, r: int, n: int) -> list[Action]:
    down, up = 0, 1
    k = _Rank(p, r)
    for _ in range(2 * (p - r) - 1):
        k.run(down, Op.F)
    for _ in range(r):
        k.run(up, Op.F)
        k.run(down, Op.F)
    for _ in range(p - r):
        k.run(up, Op.F)
        k.run(up, Op.B)
        k.run(up, Op.W)
    while k.count(up, Op.F) < k.count(down, Op.F) or k.count(down, Op.F) < n:
        if k.count(down, Op.F) < n:
            k.run(down, Op.F)
        k.run(down, Op.B)
        k.run(down, Op.W)
        k.run(up, Op.F)
        k.run(up, Op.B)
        k.run(up, Op.W)
    for _ in range(r):
        k.run(down, Op.B)
        k.run(up, Op.B)
    for _ in range(p - r):
        k.run(down, Op.B)
        k.run(down, Op.W)
    while k.count(up, Op.W) < k.count(up, Op.B):
        k.run(up, Op.W)
    while k.count(down, Op.W) < k.count(down, Op.B):
        k.run(down, Op.W)
    return k.order


def zb_v(num_stages: int, num_microbatches: int) -> Schedule:
    """ZB-V for ``num_stages`` ranks (2 * num_stages stages) and ``num_microbatches``."""
    check_sizes(num_stages, num_microbatches)
    p, m = num_stages, num_microbatches
    n = max(m, 2 * p - 1)
    rows = tuple(tuple(a for a in _rank_order(p, r, n) if a.microbatch < m) for r in range(p))
    return Schedule("zb-v", m, v_stage_to_rank(p), rows)
