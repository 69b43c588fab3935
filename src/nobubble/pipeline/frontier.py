"""The bubble-memory frontier: every schedule as a point (peak activation memory, bubble).

A *point source* (:data:`PointSource`) is a callable ``(costs, num_ranks,
num_microbatches) -> list of FrontierPoint``: :func:`generated_points` (our generators and
ZB's automatic scheduler at each memory limit), :func:`torch_points` (torch's own
schedules, when this torch has them), :func:`ilp_points` (the exact solvers; bind
``num_chunks``/``placement`` with ``functools.partial``). :func:`default_sources` binds
``pp frontier``'s; :func:`frontier` runs them and marks the Pareto-optimal points.
``peak_memory`` is in *rank units* (one microbatch's activations on one rank; 1F1B peaks
at p); ``bubble_rate`` is the simulator's ``(max span - work) / max span``.
"""

from __future__ import annotations

import importlib.util
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from functools import partial
from typing import TYPE_CHECKING

from nobubble.pipeline.actions import Schedule
from nobubble.pipeline.costs import CostModel
from nobubble.pipeline.simulate import simulate

if TYPE_CHECKING:
    from nobubble.pipeline.setting import PipelineSetting

__all__ = [
    "FRONTIER_SCHEDULES",
    "FrontierPoint",
    "Frontier",
    "PointSource",
    "default_mem_limits",
    "rank_unit",
    "ilp_available",
    "generated_points",
    "torch_points",
    "ilp_points",
    "pareto_flags",
    "default_sources",
    "frontier",
    "check_frontier",
]

FRONTIER_SCHEDULES = ("gpipe", "1f1b", "interleaved-1f1b", "zb-h1", "zb-h2", "zb-1p",
                      "zb-2p", "zb-v", "v-min", "v-half", "v-zb")  # fmt: skip


@dataclass(frozen=True, slots=True)
class FrontierPoint:
    """One schedule on the frontier picture.

    Attributes:
        name: the schedule (``"zb-auto@4"``: ZB's heuristic at a limit of 4 rank units).
        source: ``"nobubble"``, ``"torch"`` or ``"ilp"`` (or a plugged-in source's label).
        peak_memory: largest per-rank activation peak, rank units (module docstring).
        bubble_rate: (max span - work) / max span, in [0, 1).
        mem_limit: the limit it was built for (rank units), if any.
        note: solver status and gap, or why a schedule is missing (then the point is not
            drawn: ``peak_memory`` and ``bubble_rate`` are NaN).
        pareto: set by :func:`frontier`.
    """

    name: str
    source: str
    peak_memory: float
    bubble_rate: float
    mem_limit: float | None = None
    note: str = ""
    pareto: bool = False

    @property
    def ok(self) -> bool:
        return self.peak_memory == self.peak_memory  # not NaN

    def as_dict(self) -> dict:
        return {"schedule": self.name, "source": self.source, "peak_memory": self.peak_memory
                if self.ok else None, "bubble_rate": self.bubble_rate if self.ok else None,
                "mem_limit": self.mem_limit, "note": self.note, "pareto": self.pareto}  # fmt: skip


@dataclass(frozen=True, slots=True)
class Frontier:
    """Every point of one configuration; ``pareto`` the optimal ones by memory; ``seconds``
    the wall time :func:`frontier` took."""

    num_ranks: int
    num_microbatches: int
    points: tuple[FrontierPoint, ...]
    seconds: float = 0.0

    @property
    def pareto(self) -> tuple[FrontierPoint, ...]:
        return tuple(sorted((q for q in self.points if q.pareto), key=lambda q: q.peak_memory))


PointSource = Callable[[CostModel, int, int], list[FrontierPoint]]
"""``(per-rank costs, num_ranks, num_microbatches) -> points``."""


def rank_unit(costs: CostModel) -> float:
    """One microbatch's activations on the fullest rank (``costs`` per rank)."""
    return max(costs.mem_f)


def default_mem_limits(num_ranks: int) -> tuple[float, ...]:
    """Limits (rank units) for the sweeps: from about p/3 to 2p, seven of them (at least 1)."""
    p = num_ranks
    limits = {max(1.0, round(x * p, 1)) for x in (1 / 3, 1 / 2, 2 / 3, 3 / 4, 1, 1.5, 2)}
    return tuple(sorted(limits))


def _point(schedule: Schedule, costs: CostModel, source: str, **extra) -> FrontierPoint:
    result = simulate(schedule, costs)
    peak = max(result.peak_memory) / rank_unit(costs)
    return FrontierPoint(schedule.name, source, peak, result.bubble_rate, **extra)


def _missing(name: str, source: str, note: str, **extra) -> FrontierPoint:
    return FrontierPoint(name, source, float("nan"), float("nan"), note=note, **extra)


def generated_points(
    costs: CostModel,
    num_ranks: int,
    num_microbatches: int,
    *,
    names: Sequence[str] = FRONTIER_SCHEDULES,
    mem_limits: Sequence[float] = (),
) -> list[FrontierPoint]:
    """Our generators on ``costs``, then ZB's automatic scheduler at each of ``mem_limits``
    (rank units). A size a generator refuses becomes a point with a note, not an error."""
    from nobubble.pipeline.schedules import get_schedule

    points = []
    for name in names:
        try:
            sched = get_schedule(name, num_ranks=num_ranks, num_microbatches=num_microbatches,
                                 costs=costs)  # fmt: skip
        except ValueError as err:
            points.append(_missing(name, "nobubble", str(err)))
            continue
        points.append(_point(sched, costs, "nobubble"))
    for limit in mem_limits:
        try:
            sched = get_schedule("zb-1p", num_ranks=num_ranks, num_microbatches=num_microbatches,
                                 costs=costs, mem_limit=limit * rank_unit(costs))  # fmt: skip
        except ValueError as err:  # nothing fits this limit: a point with a note
            points.append(_missing(f"zb-auto@{limit:g}", "nobubble", str(err), mem_limit=limit))
            continue
        points.append(_point(sched.renamed(f"zb-auto@{limit:g}"), costs, "nobubble",
                             mem_limit=limit))  # fmt: skip
    return points


def torch_points(costs: CostModel, num_ranks: int, num_microbatches: int) -> list[FrontierPoint]:
    """torch's own schedules (none when this torch has no ``distributed.pipelining``)."""
    from nobubble.pipeline.schedules.from_torch import available_torch_schedules, torch_schedule

    points = []
    for name in available_torch_schedules():
        try:
            sched = torch_schedule(name, num_stages=num_ranks, num_microbatches=num_microbatches)
            points.append(_point(sched.renamed(name), costs, "torch"))
        except ValueError as err:  # a size torch refuses, or an order that cannot run
            points.append(_missing(name, "torch", str(err)))
    return points


def ilp_available() -> bool:
    """True when the exact solver (and OR-Tools) can be imported."""
    return (importlib.util.find_spec("ortools") is not None
            and importlib.util.find_spec("nobubble.pipeline.ilp.solve") is not None)  # fmt: skip


def ilp_points(
    costs: CostModel,
    num_ranks: int,
    num_microbatches: int,
    *,
    mem_limits: Sequence[float],
    time_limit_s: float,
    num_chunks: int = 1,
    placement: str | None = None,
) -> list[FrontierPoint]:
    """The exact solver at each memory limit (rank units), ``time_limit_s`` each; one chunk
    per rank by default, else ``num_chunks`` in ``placement`` (points ``ilp-v@4``). A limit
    it proves infeasible, or times out on, is a point with a note."""
    from nobubble.pipeline.ilp.solve import solve_optimal

    points = []
    for limit in mem_limits:
        name = f"ilp@{limit:g}" if num_chunks == 1 else f"ilp-{placement or 'v'}@{limit:g}"
        res = solve_optimal(costs, num_stages=num_ranks, num_microbatches=num_microbatches,
                            mem_limit=limit * rank_unit(costs), time_limit_s=time_limit_s,
                            num_chunks=num_chunks, placement=placement)  # fmt: skip
        gap = f", gap {res.gap:.1%}" if res.gap else ""
        note = f"{res.status}{gap}"
        if res.schedule is None:
            points.append(_missing(name, "ilp", f"{note}: {res.explanation}", mem_limit=limit))
            continue
        points.append(_point(res.schedule.renamed(name), costs, "ilp", mem_limit=limit,
                             note=note))  # fmt: skip
    return points


def pareto_flags(points: Sequence[FrontierPoint]) -> tuple[bool, ...]:
    """For each point: True if no drawn point dominates it (<= in both, < in one)."""
    drawn = [q for q in points if q.ok]

    def dominated(q: FrontierPoint) -> bool:
        return any(
            o.peak_memory <= q.peak_memory + 1e-9
            and o.bubble_rate <= q.bubble_rate + 1e-12
            and (o.peak_memory < q.peak_memory - 1e-9 or o.bubble_rate < q.bubble_rate - 1e-12)
            for o in drawn
        )

    return tuple(q.ok and not dominated(q) for q in points)


def default_sources(
    num_ranks: int,
    *,
    mem_limits: Sequence[float] | None = None,
    include_torch: bool = True,
    ilp_time_limit_s: float | None = None,
) -> list[PointSource]:
    """The usual sources: :func:`generated_points` with ZB's automatic scheduler at each of
    ``mem_limits`` (rank units, each once, in order; default :func:`default_mem_limits`),
    :func:`torch_points` unless not ``include_torch``, and with ``ilp_time_limit_s`` the exact
    solver at each limit (:func:`ilp_points`, that many seconds each). Raises ValueError when
    the solver is asked for and cannot be imported."""
    limits = tuple(sorted(set(mem_limits))) if mem_limits else default_mem_limits(num_ranks)
    sources: list[PointSource] = [partial(generated_points, mem_limits=limits)]
    if include_torch:
        sources.append(torch_points)
    if ilp_time_limit_s is not None:
        if not ilp_available():
            raise ValueError("the exact solver's points need OR-Tools (pip install ortools)")
        sources.append(partial(ilp_points, mem_limits=limits, time_limit_s=ilp_time_limit_s))
    return sources


def frontier(
    costs: CostModel,
    *,
    num_ranks: int,
    num_microbatches: int,
    sources: Sequence[PointSource] | None = None,
    on_step: Callable[[str], None] | None = None,
) -> Frontier:
    """Run every source on ``costs`` (per rank: one entry per rank) and mark the Pareto set;
    ``sources`` default to :func:`default_sources` ``(num_ranks)``.

    ``on_step(label)`` is called before each source (its ``__name__``).
    """
    if costs.num_stages != num_ranks:
        raise ValueError(f"costs have {costs.num_stages} stages; give per-rank costs "
                         f"({num_ranks} entries) for the frontier")  # fmt: skip
    if sources is None:
        sources = default_sources(num_ranks)
    started = time.perf_counter()
    points: list[FrontierPoint] = []
    for source in sources:
        if on_step is not None:
            on_step(getattr(source, "__name__", "points"))
        points.extend(source(costs, num_ranks, num_microbatches))
    flags = pareto_flags(points)
    return Frontier(num_ranks, num_microbatches,
                    tuple(replace(q, pareto=f) for q, f in zip(points, flags)),
                    time.perf_counter() - started)  # fmt: skip


def check_frontier(setting: PipelineSetting, mem_limits: Sequence[float] | None) -> None:
    """Refuse, before any work, a frontier of ``setting`` (its size and ``mem_limit``) and
    ``mem_limits`` (rank units) that it cannot do, or cannot do within the work budget."""
    if setting.mem_limit is not None:
        raise ValueError("pp frontier sweeps --mem-limits (plural), not --mem-limit")
    if setting.num_ranks is not None and setting.num_ranks < 2:
        raise ValueError(f"--ranks {setting.num_ranks}: a frontier needs at least 2 ranks")
    # every schedule, V-Min/V-Half/V-ZB too; within it --ilp is within the (larger) solve budget
    setting.check_size("compare", v_memory=True)
    if (low := min(mem_limits or [1])) < 1:
        raise ValueError(f"--mem-limits {low:g} is below one microbatch's activations (the "
                         "unit); give limits >= 1")  # fmt: skip
