"""One pipeline setting, checked before any work: its size, schedule, per-rank costs and
memory limit, what ``nobubble pp``'s flags give and Python builds alike (their ValueErrors,
one line naming the flag of the value and the fix, are the command line's errors)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Callable

    from nobubble.pipeline.actions import Schedule
    from nobubble.pipeline.compare import CompareRow
    from nobubble.pipeline.costs import CostModel
    from nobubble.pipeline.dispatch import DispatchResult
    from nobubble.pipeline.dispatch.perturb import Perturbation
    from nobubble.pipeline.ilp.common import SolveResult
    from nobubble.pipeline.simulate import SimResult

__all__ = ["PipelineSetting"]


@dataclass(frozen=True)
class PipelineSetting:
    """``schedule`` on ``num_ranks`` ranks (``-p``) for ``num_microbatches`` (``-m``), with
    ``num_chunks`` stages per rank (``-v``; None: the schedule's own), per-rank costs of the
    ``costs`` keywords of :meth:`CostModel.from_settings
    <nobubble.pipeline.costs.CostModel.from_settings>` (``model``, ``t_f`` ... ``mem_w``; one
    missing or None takes its default), and ``mem_limit``, the activation limit per rank in
    units of M_F (one rank's activations of one microbatch; None: none). ``force`` skips the
    work budgets; a size of None (a file sets it) skips them too."""

    num_ranks: int | None = 4
    num_microbatches: int | None = 8
    schedule: str | None = "zb-h1"
    num_chunks: int | None = None
    costs: dict[str, Any] = field(default_factory=dict)
    mem_limit: float | None = None
    force: bool = False

    def check_size(self, budget: str = "default", *, v_memory: bool = False) -> None:
        """Refuse a pipeline whose op count passes ``budget``
        (:func:`~nobubble.pipeline.schedules.budget.check_ops`, with the V generators' bounds
        when ``schedule`` names one or ``v_memory``) unless ``force``."""
        from nobubble.pipeline.schedules.budget import check_ops

        if self.force or self.num_ranks is None or self.num_microbatches is None:
            return
        try:
            check_ops(self.num_ranks, self.num_microbatches, num_chunks=self.num_chunks,
                      budget=budget, schedule=self.schedule, v_memory=v_memory)  # fmt: skip
        except ValueError as err:
            raise ValueError(f"--ranks/--microbatches: {err}, or --force") from None

    def cost_model(self) -> CostModel:
        """The per-rank costs (ValueError: contradictory settings), within the work budget."""
        from nobubble.pipeline.costs import CostModel

        self.check_size()
        return CostModel.from_settings(self.num_ranks, **self.costs)  # type: ignore[arg-type]

    def limit_for(self, costs: CostModel, *, below_one: bool = False) -> float | None:
        """``mem_limit`` in the memory unit of ``costs`` (None when not set); a limit below 1
        is refused unless ``below_one`` (the exact solver explains why it is infeasible)."""
        if self.mem_limit is None:
            return None
        if self.mem_limit < 1 and not below_one:
            raise ValueError(f"--mem-limit {self.mem_limit:g} is below one microbatch's "
                             "activations (the unit is M_F); give at least 1")  # fmt: skip
        return self.mem_limit * max(costs.mem_f)

    def build(self, costs: CostModel | None = None, *, unit: bool = False,
              limit_elsewhere: bool = False) -> Schedule:  # fmt: skip
        """The schedule for ``costs`` (None: :meth:`cost_model`'s, or ``unit`` costs), built
        after the size is checked; ``mem_limit`` steers zb-1p / zb-2p (which the registry
        refuses for other schedules, unless ``limit_elsewhere``: the handshake's)."""
        from nobubble.pipeline.costs import CostModel
        from nobubble.pipeline.schedules import get_schedule

        self.check_size()
        if costs is None:
            costs = CostModel.uniform(self.num_ranks) if unit else self.cost_model()  # type: ignore[arg-type]
        mem_limit = self.limit_for(costs)
        if limit_elsewhere and self.schedule not in ("zb-1p", "zb-2p"):
            mem_limit = None
        return get_schedule(self.schedule, num_ranks=self.num_ranks,  # type: ignore[arg-type]
                            num_microbatches=self.num_microbatches, costs=costs,  # type: ignore[arg-type]
                            mem_limit=mem_limit, num_chunks=self.num_chunks)  # fmt: skip

    def dispatch(self, sched: Schedule, costs: CostModel, policy: str | None,
                 perturbation: Perturbation) -> DispatchResult:  # fmt: skip
        """One step of ``sched`` under ``policy`` (None: static) and ``perturbation``; the
        handshake keeps within ``mem_limit``, refused below the schedule's own peak."""
        from nobubble.pipeline.dispatch import plan_peaks, simulate_dispatch

        policy = policy or "static"
        mem_limit = self.limit_for(costs) if policy == "handshake" else None
        if mem_limit is not None:  # the simulation refuses it too, in the costs' unit, not M_F
            mf = max(costs.mem_f)
            peaks = plan_peaks(sched, costs.for_stages(sched.stage_to_rank))
            rank = max(range(len(peaks)), key=peaks.__getitem__)
            if mem_limit < peaks[rank] * (1 - 1e-9):
                raise ValueError(
                    f"--mem-limit {self.mem_limit:g} is below {sched.name}'s peak of "
                    f"{peaks[rank] / mf:.4g} M_F on rank {rank}; give at least "
                    f"{peaks[rank] / mf:.4g}, or -s zb-1p / zb-2p, which are built for the limit"
                )
        return simulate_dispatch(sched, costs, policy=policy, perturbation=perturbation,
                                 mem_limit=mem_limit)  # fmt: skip

    def compare(self, costs: CostModel, *, include_torch: bool = True,
                ilp_time_limit_s: float | None = None,
                on_step: Callable[[str], None] | None = None) -> list[CompareRow]:  # fmt: skip
        """:func:`~nobubble.pipeline.compare.compare_schedules` of this size on ``costs`` (this
        setting's :meth:`cost_model`), ``mem_limit`` for zb-1p/zb-2p, ``num_chunks`` (None: 2)
        for interleaved 1F1B."""
        from nobubble.pipeline.compare import compare_schedules

        return compare_schedules(
            costs, num_stages=self.num_ranks, num_microbatches=self.num_microbatches,  # type: ignore[arg-type]
            include_torch=include_torch, ilp_time_limit_s=ilp_time_limit_s,
            mem_limit=self.limit_for(costs), num_chunks=self.num_chunks or 2, on_step=on_step,
        )  # fmt: skip

    def simulate(self, policy: str | None = None, perturbation: Perturbation | None = None
                 ) -> tuple[CostModel, SimResult, DispatchResult | None]:  # fmt: skip
        """The costs and simulation of :meth:`build`'s schedule: one :meth:`dispatch` step under
        ``policy`` and ``perturbation`` (also returned) when either is given, else plain."""
        from nobubble.pipeline.simulate import simulate

        costs = self.cost_model()
        sched = self.build(costs, limit_elsewhere=policy == "handshake")
        if policy is None and (perturbation is None or perturbation.is_identity):
            return costs, simulate(sched, costs), None
        from nobubble.pipeline.dispatch.perturb import Perturbation

        run = self.dispatch(sched, costs, policy, perturbation or Perturbation())
        return costs, run.sim, run

    def solve(self, *, objective: str = "span", time_limit_s: float = 60.0,
              num_workers: int | None = None, placement: str | None = None,
              on_solution: Callable[[float, float, float], None] | None = None) -> SolveResult:  # fmt: skip
        """:func:`~nobubble.pipeline.ilp.solve.solve_optimal` of this setting (``num_chunks``
        stages per rank, None: 1; ``mem_limit`` below 1 too: the solver explains why it is
        infeasible), after :meth:`check_solve`."""
        self.check_solve(placement, num_workers)
        from nobubble.pipeline.ilp.solve import solve_optimal

        costs = self.cost_model()
        return solve_optimal(
            costs, num_stages=self.num_ranks, num_microbatches=self.num_microbatches,  # type: ignore[arg-type]
            mem_limit=self.limit_for(costs, below_one=True), objective=objective,
            time_limit_s=time_limit_s, num_workers=num_workers, num_chunks=self.num_chunks or 1,
            placement=placement, on_solution=on_solution,
        )  # fmt: skip

    def check_solve(self, placement: str | None, num_workers: int | None) -> None:
        """:meth:`solve`'s checks, before the solver is loaded: ``placement`` needs 2 chunks,
        the size the solve budget, ``num_workers`` at most the cores (or CP-SAT's default of
        8) unless ``force``. Raises ValueError."""
        chunks = self.num_chunks or 1
        if placement is not None and chunks == 1:
            raise ValueError(f"--placement {placement} needs --chunks 2")
        self.check_size("solve")
        cores = os.cpu_count() or 1
        if num_workers is not None and num_workers > max(8, cores) and not self.force:
            raise ValueError(
                f"--workers {num_workers} is past this machine's {cores} cores (and CP-SAT's "
                f"default of 8); use at most {max(8, cores)}, or --force"
            )
