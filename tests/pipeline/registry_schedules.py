"""Valid schedules drawn from the registry, for property tests.

:func:`valid_schedules` draws any generator of :data:`SCHEDULE_NAMES` at a small size (p <= 4
ranks, m <= 8 microbatches) and rejects the sizes a generator refuses (interleaved-1f1b needs
m divisible by p). Shared by ``test_validate_mutations`` and ``test_csv_fuzz``.
"""

from __future__ import annotations

import functools

from hypothesis import assume
from hypothesis import strategies as st

from nobubble.pipeline.actions import Schedule
from nobubble.pipeline.costs import CostModel
from nobubble.pipeline.schedules import SCHEDULE_NAMES, get_schedule

MAX_RANKS, MAX_MICROBATCHES = 4, 8


@functools.cache
def generated(name: str, num_ranks: int, num_microbatches: int) -> Schedule | None:
    """The registry's schedule, or None where the generator refuses the size."""
    try:
        return get_schedule(
            name,
            num_ranks=num_ranks,
            num_microbatches=num_microbatches,
            costs=CostModel.uniform(num_ranks),
        )
    except ValueError:
        return None


@st.composite
def valid_schedules(draw: st.DrawFn) -> Schedule:
    name = draw(st.sampled_from(SCHEDULE_NAMES))
    num_ranks = draw(st.integers(1, MAX_RANKS))
    sched = generated(name, num_ranks, draw(st.integers(1, MAX_MICROBATCHES)))
    assume(sched is not None)
    assert sched is not None
    return sched
