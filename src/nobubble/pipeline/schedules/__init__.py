"""The schedule registry: :func:`get_schedule` by name (``gpipe``, ``1f1b``, ``zb-h1``,
``zb-h2``, ``interleaved-1f1b``, ``zb-v``, ``zb-1p``, ``zb-2p``, ``v-min``, ``v-half``,
``v-zb``, ``dualpipev``; docs/pipeline/schedules.md says what each is).

Every generator returns a :class:`~nobubble.pipeline.actions.Schedule` for ``p`` ranks and
``m`` microbatches. The order of :data:`COST_DEPENDENT_SCHEDULES` depends on ``costs``;
asked for one without ``costs``, :func:`get_schedule` tunes it for unit costs and warns
(:class:`UnitCostsWarning`, one message per name); pass measured costs, or
``CostModel.uniform(num_ranks)`` to mean unit costs.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

from nobubble.pipeline.actions import Schedule
from nobubble.pipeline.costs import CostModel
from nobubble.pipeline.schedules.handwritten import (
    check_sizes,
    gpipe,
    interleaved_1f1b,
    one_f_one_b,
    zb_handcrafted,
)

__all__ = [
    "SCHEDULE_NAMES",
    "COST_DEPENDENT_SCHEDULES",
    "V_SCHEDULES",
    "UnitCostsWarning",
    "get_schedule",
    "gpipe",
    "one_f_one_b",
    "zb_handcrafted",
    "interleaved_1f1b",
]


def _auto(name: str, factor: int) -> Callable[..., Schedule]:
    def make(num_stages, num_microbatches, *, costs=None, mem_limit=None, **_):
        from nobubble.pipeline.schedules.auto import zb_auto

        return zb_auto(
            num_stages, num_microbatches, costs=costs, mem_limit=mem_limit,
            mem_limit_factor=factor, name=name,
        )  # fmt: skip

    return make


def _zb_v(num_stages, num_microbatches, **_):
    from nobubble.pipeline.schedules.v_shape import zb_v

    return zb_v(num_stages, num_microbatches)


def _v_memory(name: str) -> Callable[..., Schedule]:
    def make(num_ranks, num_microbatches, *, costs=None, **_):
        from nobubble.pipeline.schedules.v_memory import v_memory_schedule

        return v_memory_schedule(name, num_ranks, num_microbatches, costs=costs)

    return make


def _dualpipev(num_ranks, num_microbatches, **_):
    from nobubble.pipeline.schedules.dualpipe import dualpipev

    return dualpipev(num_ranks, num_microbatches).schedule


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
    "v-min": _v_memory("v-min"),
    "v-half": _v_memory("v-half"),
    "v-zb": _v_memory("v-zb"),
    "dualpipev": _dualpipev,
}
V_SCHEDULES: tuple[str, ...] = ("zb-v", "v-min", "v-half", "v-zb", "dualpipev")
"""The schedules of two stages per rank in a V (``num_chunks`` is 2)."""
SCHEDULE_NAMES: tuple[str, ...] = tuple(_GENERATORS)
COST_DEPENDENT_SCHEDULES: tuple[str, ...] = ("zb-1p", "zb-2p", "v-min", "v-half", "v-zb")
"""The schedules whose order changes with ``costs`` (the others' order is fixed by p and m)."""


class UnitCostsWarning(UserWarning):
    """A schedule of :data:`COST_DEPENDENT_SCHEDULES` was generated without ``costs``, so its
    order is tuned for unit costs (F = B = W = 1), which real stages rarely have."""


def _unit_costs_message(name: str) -> str:
    """The warning for ``name``: the same text every time, so the default filter shows it
    once per calling line."""
    return (
        f"get_schedule({name!r}) without costs: its order is tuned for unit costs "
        "(F = B = W = 1, no communication). Pass measured ones, costs=profile.cost_model() "
        "with profile = nobubble.pipeline.runtime.profile.profile_modules(stages, "
        "inputs, targets, loss_fn), or let the planner nobubble.pipeline.runtime.planning.plan"
        " choose (Plan.schedule()); pass costs=CostModel.uniform(num_ranks) to mean unit costs"
    )


def get_schedule(
    name: str,
    *,
    num_ranks: int | None = None,
    num_microbatches: int,
    costs: CostModel | None = None,
    mem_limit: float | None = None,
    num_chunks: int | None = None,
    num_stages: int | None = None,
) -> Schedule:
    """Generate schedule ``name`` (one of :data:`SCHEDULE_NAMES`) for ``num_ranks`` ranks.

    ``costs`` (per rank) and ``mem_limit`` (activation memory per rank, same unit as the
    costs' ``mem_f``) steer the automatic schedules ``zb-1p``/``zb-2p`` (default limit p*M_F
    and 2p*M_F); ``num_chunks`` is v for ``interleaved-1f1b`` (default 2); ``costs`` also tune the
    compaction of ``v-min``/``v-half``/``v-zb``; without them those five are tuned for unit
    costs and a :class:`UnitCostsWarning` says so. The schedule's
    ``num_stages`` is ``num_ranks * num_chunks`` (model chunks), its ``num_ranks`` the ranks.
    ``num_stages`` is the old name of this function's ``num_ranks`` and is still accepted.
    """
    if num_stages is not None:
        if num_ranks is not None and num_ranks != num_stages:
            raise ValueError(
                f"get_schedule: num_ranks={num_ranks} and num_stages={num_stages} disagree; "
                "give num_ranks only (num_stages is its old name)"
            )
        num_ranks = num_stages
    if num_ranks is None:
        raise ValueError("get_schedule: give num_ranks (the pipeline ranks P)")
    key = name.lower()
    if key not in _GENERATORS:
        raise ValueError(f"unknown schedule {name!r}; choose one of {', '.join(SCHEDULE_NAMES)}")
    if num_chunks is not None and key not in ("interleaved-1f1b", *V_SCHEDULES):
        raise ValueError(
            f"num_chunks applies to interleaved-1f1b (and the V shapes: 2), not {name!r}"
        )
    if num_chunks is not None and key in V_SCHEDULES and num_chunks != 2:
        raise ValueError(f"{key} always has 2 chunks per rank, not {num_chunks}; drop --chunks")
    if mem_limit is not None and key not in ("zb-1p", "zb-2p"):
        raise ValueError(f"mem_limit applies to zb-1p / zb-2p, not {name!r}")
    check_sizes(num_ranks, num_microbatches)
    if costs is None and key in COST_DEPENDENT_SCHEDULES:
        warnings.warn(_unit_costs_message(key), UnitCostsWarning, stacklevel=2)
    return _GENERATORS[key](
        num_ranks, num_microbatches, costs=costs, mem_limit=mem_limit, num_chunks=num_chunks
    )
