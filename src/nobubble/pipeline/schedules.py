"""Hand-written schedule generators and the :func:`get_schedule` registry.

All generators return a :class:`~nobubble.pipeline.actions.Schedule` for ``p`` ranks and
``m`` microbatches; the order on each rank is the whole schedule (times come from the
simulator).

- ``gpipe``: all forwards, then all fused backwards (memory m * M_F).
- ``1f1b``: rank r warms up ``p - r - 1`` forwards, then alternates F and fused backward.
- ``zb-h1`` / ``zb-h2``: the Zero Bubble paper's handcrafted schedules, one generator with a
  warm-up factor c (1 or 2): rank r warms up ``min(c(p - r - 1), m)`` forwards; then for
  each microbatch i it runs the next F (if any is left), ``B_i``, and the oldest pending W
  once ``i >= c * r`` (W lags its B by ``c * r`` microbatches, which fills the tail bubble);
  leftover Ws run at the end. ZB-H1 keeps 1F1B's memory; ZB-H2 about twice it and removes
  the warm-up bubble as well.
- ``interleaved-1f1b``: Megatron's interleaved 1F1B with v chunks per rank (stage
  ``k * p + r`` on rank r); needs ``m % p == 0``.
- ``zb-v``: two chunks per rank in a V (:mod:`nobubble.pipeline.schedules_v`).
- ``zb-1p`` / ``zb-2p``: automatic (:mod:`nobubble.pipeline.schedules_auto`).
"""

from __future__ import annotations

from collections.abc import Callable

from nobubble.pipeline.actions import Action, Op, Schedule
from nobubble.pipeline.costs import CostModel

__all__ = [
    "SCHEDULE_NAMES",
    "get_schedule",
    "gpipe",
    "one_f_one_b",
    "zb_handcrafted",
    "interleaved_1f1b",
]


def _check_sizes(num_stages: int, num_microbatches: int) -> None:
    for label, value in (("num_stages", num_stages), ("num_microbatches", num_microbatches)):
        if not (isinstance(value, int) and value >= 1):
            raise ValueError(f"{label}={value!r} must be a positive integer")


def gpipe(num_stages: int, num_microbatches: int) -> Schedule:
    """All forwards, then all backwards in reverse microbatch order."""
    _check_sizes(num_stages, num_microbatches)
    m = num_microbatches
    rows = [
        [Action(r, Op.F, i) for i in range(m)] + [Action(r, Op.BW, i) for i in range(m)]
        for r in range(num_stages)
    ]
    return Schedule("gpipe", m, tuple(range(num_stages)), tuple(map(tuple, rows)))


def zb_handcrafted(
    num_stages: int, num_microbatches: int, *, warmup_factor: int, split_backward: bool
) -> Schedule:
    """The paper's warm-up-c generator (module docstring). ``warmup_factor=1`` with a fused
    backward is 1F1B; with a split backward ZB-H1; ``warmup_factor=2`` split is ZB-H2."""
    _check_sizes(num_stages, num_microbatches)
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
    _check_sizes(num_stages, num_microbatches)
    p, m, v = num_stages, num_microbatches, num_chunks
    if not (isinstance(v, int) and v >= 1):
        raise ValueError(f"num_chunks={v!r} must be a positive integer")
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


def _auto(name: str, factor: int) -> Callable[..., Schedule]:
    def make(num_stages, num_microbatches, *, costs=None, mem_limit=None, **_):
        from nobubble.pipeline.schedules_auto import zb_auto

        return zb_auto(
            num_stages, num_microbatches, costs=costs, mem_limit=mem_limit,
            mem_limit_factor=factor, name=name,
        )  # fmt: skip

    return make


def _zb_v(num_stages, num_microbatches, **_):
    from nobubble.pipeline.schedules_v import zb_v

    return zb_v(num_stages, num_microbatches)


_GENERATORS: dict[str, Callable[..., Schedule]] = {
    "gpipe": lambda p, m, **_: gpipe(p, m),
    "1f1b": lambda p, m, **_: one_f_one_b(p, m),
    "interleaved-1f1b": lambda p, m, num_chunks=None, **_: interleaved_1f1b(
        p, m, num_chunks=2 if num_chunks is None else num_chunks
    ),
    "zb-h1": lambda p, m, **_: zb_handcrafted(p, m, warmup_factor=1, split_backward=True),
    "zb-h2": lambda p, m, **_: zb_handcrafted(p, m, warmup_factor=2, split_backward=True),
    "zb-1p": _auto("zb-1p", 1),
    "zb-2p": _auto("zb-2p", 2),
    "zb-v": _zb_v,
}
SCHEDULE_NAMES: tuple[str, ...] = tuple(_GENERATORS)


def get_schedule(
    name: str,
    *,
    num_stages: int,
    num_microbatches: int,
    costs: CostModel | None = None,
    mem_limit: float | None = None,
    num_chunks: int | None = None,
) -> Schedule:
    """Generate schedule ``name`` (one of :data:`SCHEDULE_NAMES`) for ``num_stages`` ranks.

    ``costs`` (per rank) and ``mem_limit`` (activation memory per rank, same unit as the
    costs' ``mem_f``) steer the automatic schedules ``zb-1p``/``zb-2p`` (default limit p*M_F
    and 2p*M_F); ``num_chunks`` is v for ``interleaved-1f1b`` (default 2).
    """
    key = name.lower()
    if key not in _GENERATORS:
        raise ValueError(f"unknown schedule {name!r}; choose one of {', '.join(SCHEDULE_NAMES)}")
    if num_chunks is not None and key not in ("interleaved-1f1b", "zb-v"):
        raise ValueError(f"--chunks applies to interleaved-1f1b (and zb-v: 2), not {name!r}")
    if num_chunks is not None and key == "zb-v" and num_chunks != 2:
        raise ValueError(f"zb-v always has 2 chunks per rank, not {num_chunks}")
    if mem_limit is not None and key not in ("zb-1p", "zb-2p"):
        raise ValueError(f"--mem-limit applies to zb-1p / zb-2p, not {name!r}")
    _check_sizes(num_stages, num_microbatches)
    return _GENERATORS[key](
        num_stages, num_microbatches, costs=costs, mem_limit=mem_limit, num_chunks=num_chunks
    )
