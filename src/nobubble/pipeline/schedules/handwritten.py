"""Hand-written schedules: GPipe, 1F1B, interleaved 1F1B, and the Zero Bubble paper's ZB-H1/H2,
each a :class:`~nobubble.pipeline.actions.Schedule` for ``num_stages`` ranks (one stage per
rank, except interleaved 1F1B) and ``num_microbatches`` microbatches.
"""

from __future__ import annotations

from nobubble.pipeline.actions import Action, Op, Schedule
from nobubble.validation import check_value

__all__ = ["gpipe", "one_f_one_b", "zb_handcrafted", "interleaved_1f1b", "check_sizes"]


def check_sizes(num_ranks: int, num_microbatches: int) -> None:
    """Refuse a pipeline shape that is not two integers >= 1."""
    check_value("num_ranks", num_ranks, ">= 1", integer=True)
    check_value("num_microbatches", num_microbatches, ">= 1", integer=True)


def gpipe(num_stages: int, num_microbatches: int) -> Schedule:
    """All forwards, then all backwards in reverse microbatch order."""
    check_sizes(num_stages, num_microbatches)
    m = num_microbatches
    rows = [
        [Action(r, Op.F, i) for i in range(m)] + [Action(r, Op.BW, i) for i in range(m)]
        for r in range(num_stages)
    ]
    return Schedule("gpipe", m, tuple(range(num_stages)), tuple(map(tuple, rows)))


def zb_handcrafted(
    num_stages: int, num_microbatches: int, *, warmup_factor: int, split_backward: bool
) -> Schedule:
    """The paper's warm-up-c generator: rank r warms up ``min(c(p - r - 1), m)`` forwards;
    then for each microbatch i it runs the next F (if any is left), ``B_i``, and the oldest
    pending W once ``i >= c * r`` (W lags its B by ``c * r`` microbatches, filling the tail
    bubble); leftover Ws run at the end. ``warmup_factor=1`` with a fused backward is 1F1B;
    with a split backward ZB-H1 (1F1B's memory); ``warmup_factor=2`` split is ZB-H2 (about
    twice it, no warm-up bubble)."""
    check_sizes(num_stages, num_microbatches)
    p, m, c = num_stages, num_microbatches, warmup_factor
    rows = []
    for r in range(p):
        num_warmup = min(c * (p - r - 1), m)
        row = [Action(r, Op.F, i) for i in range(num_warmup)]
        next_f, next_w = num_warmup, 0
        for i in range(m):
            if next_f < m:
                row.append(Action(r, Op.F, next_f))
                next_f += 1
            if not split_backward:
                row.append(Action(r, Op.BW, i))
                continue
            row.append(Action(r, Op.B, i))
            if i >= c * r:
                row.append(Action(r, Op.W, next_w))
                next_w += 1
        row.extend(Action(r, Op.W, i) for i in range(next_w, m) if split_backward)
        rows.append(tuple(row))
    name = "1f1b" if not split_backward else f"zb-h{c}"
    return Schedule(name, m, tuple(range(p)), tuple(rows))


def one_f_one_b(num_stages: int, num_microbatches: int) -> Schedule:
    return zb_handcrafted(num_stages, num_microbatches, warmup_factor=1, split_backward=False)


def interleaved_1f1b(num_stages: int, num_microbatches: int, *, num_chunks: int = 2) -> Schedule:
    """Megatron's interleaved 1F1B: ``num_chunks`` (v) stages per rank, stage ``k*p + r`` on
    rank r; microbatches go through in groups of p per chunk. Needs ``m % p == 0``."""
    check_sizes(num_stages, num_microbatches)
    p, m, v = num_stages, num_microbatches, num_chunks
    check_value("num_chunks", v, ">= 1", integer=True)
    if m % p:
        raise ValueError(
            f"interleaved-1f1b needs num_microbatches divisible by num_stages; "
            f"m={m} % p={p} = {m % p} (use m={m + p - m % p})"
        )
    total = m * v

    def forward_unit(k: int) -> tuple[int, int]:  # k-th forward of a rank -> (chunk, mb)
        group, within = divmod(k, p * v)
        return within // p, group * p + within % p

    def backward_unit(k: int) -> tuple[int, int]:
        chunk, mb = forward_unit(k)
        return v - 1 - chunk, mb

    rows = []
    for r in range(p):
        num_warmup = total if m == p else min((p - r - 1) * 2 + (v - 1) * p, total)
        row = []
        for k in range(num_warmup):
            chunk, mb = forward_unit(k)
            row.append(Action(chunk * p + r, Op.F, mb))
        for k in range(total - num_warmup):
            chunk, mb = forward_unit(num_warmup + k)
            row.append(Action(chunk * p + r, Op.F, mb))
            chunk, mb = backward_unit(k)
            row.append(Action(chunk * p + r, Op.BW, mb))
        for k in range(total - num_warmup, total):
            chunk, mb = backward_unit(k)
            row.append(Action(chunk * p + r, Op.BW, mb))
        rows.append(tuple(row))
    stage_to_rank = tuple(s % p for s in range(p * v))
    return Schedule("interleaved-1f1b", m, stage_to_rank, tuple(rows))
