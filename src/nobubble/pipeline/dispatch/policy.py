"""One entry point for both dispatch policies: :func:`simulate_dispatch` -> :class:`DispatchResult`.

``static`` walks the schedule's order (the simulator's worklist with a duration per op;
unperturbed, :func:`~nobubble.pipeline.simulate.simulate`'s timeline to the last bit);
``handshake`` picks each next op at run time (:mod:`.handshake`), and the order it ran is
returned as a schedule that validates. Both meet the same
:class:`~nobubble.pipeline.dispatch.perturb.Perturbation` durations and return the
simulator's :class:`~nobubble.pipeline.simulate.SimResult` of the order that ran.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from nobubble.pipeline.actions import Schedule
from nobubble.pipeline.costs import CostModel
from nobubble.pipeline.dispatch.handshake import HandshakeRule, plan_peaks, run_handshake
from nobubble.pipeline.dispatch.perturb import Perturbation
from nobubble.pipeline.simulate import SimResult, per_stage_costs, run_timeline, summarize
from nobubble.pipeline.validate import check_complete, validate

__all__ = ["DISPATCH_POLICIES", "DispatchResult", "simulate_dispatch"]

DISPATCH_POLICIES: tuple[str, ...] = ("static", "handshake")


@dataclass(frozen=True, slots=True)
class DispatchResult:
    """One simulated step under a dispatch policy.

    ``sim`` is the timeline of the order that ran (``sim.schedule``: the plan itself for
    ``static``, the handshake's executed order otherwise); ``limits`` the activation memory
    allowed per rank (``static``: the plan's own peaks, which it keeps by construction);
    ``deviations`` how many ops the handshake ran before an earlier op of their rank's plan
    (0 for ``static``).
    """

    policy: str
    plan: Schedule
    sim: SimResult
    perturbation: Perturbation
    limits: tuple[float, ...]
    step: int = 0
    deviations: int = 0

    @property
    def schedule(self) -> Schedule:
        """The per-rank order that ran."""
        return self.sim.schedule

    @property
    def bubble_rate(self) -> float:
        return self.sim.bubble_rate

    @property
    def makespan(self) -> float:
        return self.sim.makespan

    @property
    def peak_memory(self) -> tuple[float, ...]:
        return self.sim.peak_memory

    def describe(self, mem_f: float) -> str:
        """``handshake, jitter 0.2, straggler 1:1.5, seed 0, limit 4 M_F, 3 deviations``: the
        policy, the perturbation and (handshake) the limits in units of ``mem_f`` (M_F, one
        microbatch's activations on a rank)."""
        pert = self.perturbation
        parts = [self.policy]
        parts += [f"jitter {pert.jitter:g}"] if pert.jitter else []
        parts += [f"straggler {s}" for s in pert.stragglers]
        parts += [f"seed {pert.seed}"] if pert.jitter else []
        if self.policy == "handshake":
            label = "limit" if len(set(self.limits)) == 1 else "limits up to"
            parts.append(f"{label} {max(self.limits) / mem_f:.4g} M_F, "
                         f"{self.deviations} deviations")  # fmt: skip
        return ", ".join(parts)

    def summary(self) -> dict:
        """The simulator's JSON figures plus the policy, the perturbation and the limits."""
        pert = self.perturbation
        return self.sim.summary() | {
            "dispatch": self.policy,
            "plan": self.plan.name,
            "jitter": pert.jitter,
            "stragglers": [str(s) for s in pert.stragglers],
            "seed": pert.seed,
            "step": self.step,
            "mem_limit": list(self.limits),
            "deviations": self.deviations,
        }


def simulate_dispatch(
    schedule: Schedule,
    costs: CostModel,
    *,
    policy: str = "static",
    perturbation: Perturbation | None = None,
    mem_limit: float | Sequence[float] | None = None,
    rule: HandshakeRule | None = None,
    step: int = 0,
) -> DispatchResult:
    """Simulate one training step of ``schedule`` under a dispatch policy.

    Args:
        schedule: the plan (any valid schedule; the handshake follows its order).
        costs: nominal costs, one entry per stage or per rank (split over a rank's chunks,
            as :func:`~nobubble.pipeline.simulate.simulate` does).
        policy: ``"static"`` or ``"handshake"`` (:data:`DISPATCH_POLICIES`).
        perturbation: jitter and stragglers (default: none, the nominal costs).
        mem_limit: ``handshake`` only: activation memory per rank (one number, or one per
            rank), at least the plan's peak on every rank; default the plan's own peaks.
        rule: ``handshake`` only: the rule's switches (default :class:`HandshakeRule()`).
        step: the training step simulated (stragglers may be limited to some steps; the
            jitter draws differ per step).
    Raises ValueError for an unknown policy or a limit below the plan's peak;
    :class:`~nobubble.pipeline.validate.ScheduleError` for an invalid schedule.
    """
    if policy not in DISPATCH_POLICIES:
        raise ValueError(f"unknown dispatch policy {policy!r}; choose one of "
                         f"{', '.join(DISPATCH_POLICIES)}")  # fmt: skip
    if policy == "static" and (mem_limit is not None or rule is not None):
        raise ValueError("mem_limit and rule apply to the handshake policy; the static "
                         "order keeps its own memory")  # fmt: skip
    if policy == "handshake" and costs.recomputes:
        raise ValueError("the handshake's memory rule counts F as the only op that adds "
                         "memory, which recompute breaks (B rebuilds activations); simulate "
                         "recompute costs with policy='static'")  # fmt: skip
    costs = per_stage_costs(schedule, costs)
    perturbation = perturbation if perturbation is not None else Perturbation()
    durations = perturbation.durations(
        costs, schedule.stage_to_rank, schedule.num_microbatches, step=step
    )
    peaks = plan_peaks(schedule, costs)
    if policy == "static":
        check_complete(schedule)
        start, end = run_timeline(schedule, durations.of, costs.t_comm)
        sim = summarize(schedule, costs, start, end)
        return DispatchResult(policy, schedule, sim, perturbation, peaks, step)
    validate(schedule)  # the deadlock-freedom argument starts from a valid plan
    limits = _limits(mem_limit, peaks)
    run = run_handshake(
        schedule, costs, limits=limits, duration=durations.of, rule=rule or HandshakeRule()
    )
    validate(run.schedule)
    sim = summarize(run.schedule, costs, run.start, run.end)
    return DispatchResult(policy, schedule, sim, perturbation, limits, step, run.deviations)


def _limits(
    mem_limit: float | Sequence[float] | None, peaks: tuple[float, ...]
) -> tuple[float, ...]:
    if mem_limit is None:
        return peaks
    if isinstance(mem_limit, int | float):
        return (float(mem_limit),) * len(peaks)
    limits = tuple(float(x) for x in mem_limit)
    if len(limits) != len(peaks):
        raise ValueError(
            f"mem_limit has {len(limits)} entries; give one number, or one per rank ({len(peaks)})"
        )
    return limits
