"""The ``static`` dispatch policy: every rank walks its precomputed order, with the
durations a :class:`~nobubble.pipeline.dispatch.perturb.Perturbation` gives.

This is :func:`nobubble.pipeline.simulate.simulate` with a duration per op instead of one
per stage (the same worklist: a rank advances until its next action waits for an input that
is not computed yet, then parks on it). With unperturbed durations both give the same
timeline to the last bit, which the tests check. :func:`timeline_result` turns any executed
timeline into the simulator's :class:`~nobubble.pipeline.simulate.SimResult`, so pictures
and summaries work on dispatched runs as on simulated ones.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from nobubble.pipeline.actions import Action, Schedule
from nobubble.pipeline.costs import CostModel
from nobubble.pipeline.simulate import SimResult, run_timeline, summarize

__all__ = ["run_static", "timeline_result"]

Timeline = tuple[list[list[float]], list[list[float]]]  # start[r][k], end[r][k]


def run_static(schedule: Schedule, duration: Callable[[Action], float], t_comm: float) -> Timeline:
    """Start and end of every action when each rank runs ``schedule`` in order, each taking
    ``duration(action)``: the simulator's own worklist
    (:func:`~nobubble.pipeline.simulate.run_timeline`)."""
    return run_timeline(schedule, duration, t_comm)


def timeline_result(
    schedule: Schedule, costs: CostModel, start: Sequence[Sequence[float]],
    end: Sequence[Sequence[float]],
) -> SimResult:  # fmt: skip
    """The simulator's summary of an executed timeline (``costs`` one entry per stage).

    Work per rank (``busy``) is the time its ops really took, so a straggler's rank is the
    busiest one and the bubble rate measures idle time against it, as the simulator does
    for ranks of unequal cost.
    """
    return summarize(schedule, costs, start, end)
