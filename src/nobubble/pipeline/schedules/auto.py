"""ZB-1p / ZB-2p: automatic zero-bubble schedules under an activation-memory limit.

A greedy list scheduler after the Zero Bubble paper's heuristic (Qi et al., ICLR 2024,
section 3.1; the steps: docs/pipeline/schedules.md): warm-up forwards as fit, then one F and
one B per microbatch with pending Ws filling the waits, the rest at the end. Of its 8
variants the one with the shortest longest-rank span is kept. The memory limit per rank
defaults to ``p * M_F`` (ZB-1p, 1F1B's activation memory) or ``2p * M_F`` (ZB-2p); any
other via ``mem_limit``.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from nobubble.pipeline.actions import Action, Op, Schedule
from nobubble.pipeline.costs import CostModel

__all__ = ["zb_auto", "AutoVariant"]


@dataclass(frozen=True, slots=True)
class AutoVariant:
    """One setting of the heuristic's three switches (docs/pipeline/schedules.md, ZB-1p / ZB-2p)."""

    bubble_before_first_b: bool
    prioritize_b: bool
    fill_greedy: bool


_KIND = {Op.F: 0, Op.B: 1, Op.W: 2}


class _CannotFit(Exception):
    """This variant cannot respect the memory limit (or reached an unplaceable op)."""


class _Builder:
    """Per-rank clocks, op counts, memory and bubble while the orders are built."""

    def __init__(self, costs: CostModel, num_microbatches: int, limits: list[float]):
        p, m = costs.num_stages, num_microbatches
        self.c, self.p, self.m, self.limits = costs, p, m, limits
        self.count = [[0, 0, 0] for _ in range(p)]  # F, B, W placed on each rank
        self.clock = [0.0] * p
        self.mem = [0.0] * p
        self.bubble = [0.0] * p
        self.f_end = [[0.0] * m for _ in range(p)]
        self.b_end = [[0.0] * m for _ in range(p)]
        self.order: list[list[tuple[Op, int]]] = [[] for _ in range(p)]
        self.durations = (costs.t_f, costs.t_b, costs.t_w)
        self.mem_delta = (costs.mem_f, tuple(-x for x in costs.mem_b),
                          tuple(-x for x in costs.mem_w))  # fmt: skip
        self.max_bubble = 0.0  # bubbles only grow, so the running max is the max

    def nf(self, r: int) -> int:
        return self.count[r][0]

    def pending_w(self, r: int) -> int:
        return self.count[r][1] - self.count[r][2]

    def input_ready(self, r: int, op: Op, i: int) -> float:
        """When the input of op ``op`` on microbatch ``i`` reaches rank r."""
        if op is Op.F and r > 0:
            if self.count[r - 1][0] <= i:
                raise _CannotFit(f"F{i} on rank {r} before rank {r - 1}")
            return self.f_end[r - 1][i] + self.c.t_comm
        if op is Op.B and r < self.p - 1:
            if self.count[r + 1][1] <= i:
                raise _CannotFit(f"B{i} on rank {r} before rank {r + 1}")
            return self.b_end[r + 1][i] + self.c.t_comm
        return 0.0

    def put(self, r: int, op: Op) -> None:
        kind = _KIND[op]
        counts = self.count[r]
        i = counts[kind]
        if kind == 1 and counts[0] <= i:
            raise _CannotFit(f"B{i} on rank {r} before its F")
        clock = self.clock[r]
        start = clock if kind == 2 else max(clock, self.input_ready(r, op, i))
        if counts[0] > 0 and start > clock:
            self.bubble[r] += start - clock
            self.max_bubble = max(self.max_bubble, self.bubble[r])
        end = self.clock[r] = start + self.durations[kind][r]
        if kind == 0:
            self.f_end[r][i] = end
        elif kind == 1:
            self.b_end[r][i] = end
        self.mem[r] += self.mem_delta[kind][r]
        counts[kind] = i + 1
        self.order[r].append((op, i))

    def make_room(self, r: int, need: float) -> None:
        """Run pending Ws until ``need`` more memory fits under the limit."""
        while self.mem[r] + need > self.limits[r] + 1e-9 * self.limits[r]:
            if self.pending_w(r) == 0:
                raise _CannotFit(f"rank {r} cannot fit memory")
            self.put(r, Op.W)

    def fill_wait(self, r: int, ready_at: float, fill_greedy: bool) -> None:
        """Insert pending Ws into the wait until ``ready_at``."""
        while self.pending_w(r) and self.clock[r] + self.c.t_w[r] <= ready_at:
            self.put(r, Op.W)
        # A W that overruns the wait delays the next op. Take it anyway when the wait would
        # make this rank the most idle one, or always in the greedy variant.
        wait = ready_at - self.clock[r]
        overrun_ok = fill_greedy or wait > self.max_bubble - self.bubble[r]
        if self.pending_w(r) and wait > 0 and overrun_ok:
            self.put(r, Op.W)


def _warmup(b: _Builder, v: AutoVariant) -> tuple[int, ...]:
    """Place the warm-up; returns the extra forwards per rank (what the variant changed)."""
    p, m, c = b.p, b.m, b.c
    for r in range(p):
        b.put(r, Op.F)
    extra = [0] * p
    grad_back = b.f_end[p - 1][0] + c.t_b[p - 1]  # end of B0 on the last rank
    for r in range(p - 2, -1, -1):
        mem, clock = b.mem[r], b.clock[r]
        while b.nf(r) + extra[r] < m and mem + c.mem_f[r] <= b.limits[r] * (1 + 1e-9):
            arrives = grad_back + c.t_comm
            too_late = clock + c.t_f[r] > arrives if v.bubble_before_first_b else clock >= arrives
            if too_late:
                break
            mem, clock = mem + c.mem_f[r], clock + c.t_f[r]
            extra[r] += 1
        grad_back = max(clock, grad_back + c.t_comm) + c.t_b[r]
    for r in range(1, p):  # strictly fewer warm-up forwards down the pipeline
        while 0 < extra[r] >= extra[r - 1] and b.nf(r) + extra[r] < m:
            extra[r] -= 1
    for r in range(p):
        for _ in range(extra[r]):
            b.put(r, Op.F)
    for r in range(p - 1, -1, -1):
        b.put(r, Op.B)
    return tuple(extra)


def _wants_forward(b: _Builder, r: int, v: AutoVariant) -> bool:
    c = b.c
    if b.nf(r) >= b.m:
        return False
    if not (v.prioritize_b and r + 1 < b.p and b.nf(r) >= b.nf(r + 1) + 2):
        return True
    # rank r is ahead: take the F only if it does not delay the gradient coming back
    grad_due = b.clock[r + 1] + c.t_f[r + 1] + c.t_b[r + 1] + c.t_comm
    if b.clock[r] >= grad_due:
        return False
    mem, w_time, pending = b.mem[r] + c.mem_f[r], 0.0, b.pending_w(r)
    while mem > b.limits[r] and pending:
        w_time, mem, pending = w_time + c.t_w[r], mem - c.mem_w[r], pending - 1
    if b.clock[r] + c.t_f[r] + w_time <= grad_due:
        return True
    return grad_due - b.clock[r] > b.max_bubble - b.bubble[r]


def _steady(b: _Builder, v: AutoVariant) -> None:
    p, m, c = b.p, b.m, b.c
    for i in range(1, m):
        take_f = [_wants_forward(b, r, v) for r in range(p)]
        for r in range(p - 2, -1, -1):  # a rank takes an F only if its successor does
            take_f[r] = take_f[r] and take_f[r + 1]
        for r in range(p):
            if not take_f[r]:
                continue
            b.make_room(r, c.mem_f[r])
            if r > 0:
                b.fill_wait(r, b.input_ready(r, Op.F, b.nf(r)), v.fill_greedy)
            b.put(r, Op.F)
        for r in range(p - 1, -1, -1):
            if r + 1 < p:
                b.fill_wait(r, b.input_ready(r, Op.B, i), v.fill_greedy)
            if r == 0 and b.nf(0) == m:
                while b.pending_w(0):
                    b.put(0, Op.W)
            b.put(r, Op.B)
    for r in range(p):
        while b.pending_w(r):
            b.put(r, Op.W)


def _build(
    costs: CostModel, m: int, limits: list[float], v: AutoVariant, seen: set
) -> _Builder | None:
    """Build one variant; None if an identical one (same warm-up, same switches) was built."""
    b = _Builder(costs, m, limits)
    key = (_warmup(b, v), v.prioritize_b, v.fill_greedy)
    if key in seen:
        return None  # the warm-up switch made no difference: the rest is deterministic
    seen.add(key)
    _steady(b, v)
    return b


def _span(b: _Builder) -> float:
    """Longest rank span: end of its last op minus start of its first F."""
    return max(b.clock[r] - (b.f_end[r][0] - b.c.t_f[r]) for r in range(b.p))


def zb_auto(
    num_stages: int,
    num_microbatches: int,
    *,
    costs: CostModel | None = None,
    mem_limit: float | None = None,
    mem_limit_factor: int = 1,
    name: str | None = None,
) -> Schedule:
    """Best of the 8 heuristic variants under a per-rank memory limit.

    Args:
        costs: per-rank costs (one stage per rank); default T_F = T_B = T_W = 1, M_F = 1.
        mem_limit: activation memory allowed per rank (unit of ``costs.mem_f``); default
            ``mem_limit_factor * p * M_F(rank)``.
    Raises ValueError when the limit is below one microbatch's activations or no variant
    fits it.
    """
    p, m = num_stages, num_microbatches
    costs = costs if costs is not None else CostModel.uniform(p)
    if costs.num_stages != p:
        raise ValueError(f"zb-1p/zb-2p need one cost entry per rank ({p}); got {costs.num_stages}")
    if mem_limit is None:
        limits = [mem_limit_factor * p * costs.mem_f[r] for r in range(p)]
    else:
        limits = [float(mem_limit)] * p
        worst = max(costs.mem_f)
        if mem_limit < worst:
            raise ValueError(
                f"mem_limit={mem_limit:g} is below one microbatch's activations "
                f"(M_F={worst:g}); give at least M_F"
            )
    best: _Builder | None = None
    seen: set = set()
    for flags in itertools.product((True, False), repeat=3):
        try:
            built = _build(costs, m, limits, AutoVariant(*flags), seen)
        except _CannotFit:
            continue
        if built is None:
            continue
        if best is None or _span(built) < _span(best) - 1e-12:
            best = built
    if best is None:
        raise ValueError(
            f"no zero-bubble schedule fits a memory limit of {min(limits):g} per rank "
            f"(M_F={max(costs.mem_f):g}); raise mem_limit"
        )
    label = name or f"zb-{mem_limit_factor}p"
    rows = tuple(tuple(Action(r, op, i) for op, i in order) for r, order in enumerate(best.order))
    return Schedule(label, m, tuple(range(p)), rows)
