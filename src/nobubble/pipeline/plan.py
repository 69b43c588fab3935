"""The planner: per-block costs -> cut x schedule x microbatch count x recompute -> :class:`Plan`.

A stage's costs are the sums of its blocks' :class:`BlockCosts` (:func:`stage_costs`),
except on the first stage, whose whole backward runs in W. :func:`plan_from_costs` simulates
every candidate (cuts: the min-bottleneck cut and its neighbourhood, or all cuts when few;
schedules by name, ``"auto"`` among 1F1B, ZB-H1, ZB-2p and, with enough blocks, interleaved
1F1B and ZB-V; microbatch counts; recompute) and, among those whose peak activation memory
fits ``memory_limit`` and within ``tolerance`` of the fastest, keeps the least memory. 1F1B
on the min-bottleneck cut is always weighed. Pure and deterministic; a plan round-trips
through JSON (:meth:`Plan.to_json`, :meth:`Plan.from_json`, :meth:`Plan.read`).
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import os
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from nobubble.files import read_input_text
from nobubble.pipeline.actions import Schedule
from nobubble.pipeline.costs import CostModel
from nobubble.pipeline.partition import equal_sizes
from nobubble.pipeline.plan_inputs import (
    BlockCosts,
    MiB,
    candidate_cuts,
    check_inputs,
    chunks_of,
    cuts_from_sizes,
    microbatch_counts,
    pinned_cuts,
    schedule_names,
    sizes_from_cuts,
    stage_costs,
)
from nobubble.pipeline.schedules import get_schedule
from nobubble.pipeline.simulate import SimResult, simulate

__all__ = [
    "BlockCosts",
    "Candidate",
    "Plan",
    "plan_from_costs",
    "stage_costs",
    "candidate_cuts",
    "sizes_from_cuts",
    "cuts_from_sizes",
    "Setting",
]


@dataclass(frozen=True, slots=True)
class Candidate:
    """One weighed configuration and its prediction.

    ``cuts[k]`` is the first block of stage ``k + 1`` (``num_stages - 1`` entries, increasing);
    ``recompute`` has one flag per stage; ``predicted_peak_bytes`` one peak per rank;
    ``predicted_bubble_rate`` the simulated step's bubble rate (None in a plan file written
    before it was kept).
    """

    cuts: tuple[int, ...]
    schedule: str
    num_microbatches: int
    recompute: tuple[bool, ...]
    predicted_step_ms: float
    predicted_peak_bytes: tuple[float, ...]
    fits: bool
    actions: str | None = None
    """The schedule as torch's CSV when its name does not rebuild it (the exact solver's,
    ``ilp-optimal`` or ``ilp-feasible``); None: rebuilt from the registry by name."""
    predicted_bubble_rate: float | None = None

    def sort_key(self) -> tuple:
        """Faster first; ties: the least peak, fewer microbatches, schedule name, cuts, no
        recompute first."""
        return (self.predicted_step_ms, max(self.predicted_peak_bytes), self.num_microbatches,
                self.schedule, self.cuts, self.recompute)  # fmt: skip


@dataclass(frozen=True, slots=True)
class Setting:
    """What a plan was made from, besides the costs: enough to rebuild its stage costs and
    so its schedule (a cost-dependent order such as ZB-2p is only reproducible from them)."""

    num_ranks: int
    batch_size: int | None = None
    """Rows per step (None: the costs are for the microbatch as it is)."""
    microbatch_size: int | None = None
    """Rows the block costs were measured at."""
    first_stage_input_grad: bool = False
    comm_ms_per_byte: float = 0.0
    input_bytes: float = 0.0
    memory_limit: float | None = None
    """Peak activation bytes allowed per rank (None: no limit)."""
    op_overhead_ms: float = 0.0
    """The runtime's fixed cost of one action (dispatch, hand-over, wake-up), added to every
    F, B, W and BW (:func:`~nobubble.pipeline.runtime.planning.measure_runtime` measures it)."""

    def scale(self, num_microbatches: int) -> float:
        """Rows of one of ``num_microbatches`` microbatches / rows profiled."""
        if self.batch_size is None or self.microbatch_size is None:
            return 1.0
        return self.batch_size / num_microbatches / self.microbatch_size


@dataclass(frozen=True, slots=True)
class Plan:
    """The chosen :class:`Candidate` for ``blocks`` (the block costs it was planned from) in
    ``setting``, and every candidate weighed, best first. The chosen one's fields read as
    the plan's own (``p.cuts``, ``p.num_microbatches``, ...); :meth:`schedule` rebuilds the
    very schedule the planner simulated."""

    blocks: tuple[BlockCosts, ...]
    setting: Setting
    chosen: Candidate
    candidates: tuple[Candidate, ...]

    @property
    def num_blocks(self) -> int:
        return len(self.blocks)

    @property
    def num_ranks(self) -> int:
        return self.setting.num_ranks

    @property
    def num_stages(self) -> int:
        """Stages of the chosen cut: ``num_ranks``, or twice it for a V or interleaved plan."""
        return len(self.chosen.cuts) + 1

    @property
    def cuts(self) -> tuple[int, ...]:
        return self.chosen.cuts

    @property
    def schedule_name(self) -> str:
        return self.chosen.schedule

    @property
    def num_microbatches(self) -> int:
        return self.chosen.num_microbatches

    @property
    def recompute(self) -> tuple[bool, ...]:
        return self.chosen.recompute

    @property
    def predicted_step_ms(self) -> float:
        return self.chosen.predicted_step_ms

    @property
    def predicted_peak_bytes(self) -> tuple[float, ...]:
        return self.chosen.predicted_peak_bytes

    def stage_sizes(self) -> tuple[int, ...]:
        """Blocks per stage, in pipeline order (``len(cuts) + 1`` entries)."""
        return sizes_from_cuts(self.cuts, self.num_blocks)

    def schedule(self, candidate: Candidate | None = None) -> Schedule:
        """The chosen schedule (or ``candidate``'s), built from the stage costs the planner
        simulated for it."""
        return _build(self.blocks, self.chosen if candidate is None else candidate,
                      self.setting)[1]  # fmt: skip

    def simulate(self, candidate: Candidate | None = None) -> SimResult:
        """The simulated step of the chosen candidate (or ``candidate``): the timeline behind
        its prediction (bubble, per-op times, a Gantt chart)."""
        costs, sched = _build(self.blocks, self.chosen if candidate is None else candidate,
                              self.setting)  # fmt: skip
        return simulate(sched, costs)

    def weigh(
        self,
        cuts: Sequence[int],
        schedule: str,
        *,
        num_microbatches: int | None = None,
        recompute: bool = False,
    ) -> Candidate:
        """The prediction for any configuration of these blocks in this setting (the naive
        equal-count cut, a schedule picked by name, ...), simulated as the search does;
        ``num_microbatches`` defaults to the plan's.

        Raises:
            ValueError: cuts that are not increasing block indices leaving every stage a
                block, or a schedule outside its generator's domain.
        """
        schedule_names([schedule], self.num_ranks, self.num_blocks)  # a known name, or why not
        cuts = tuple(int(c) for c in cuts)
        sizes = sizes_from_cuts(cuts, self.num_blocks)
        if min(sizes) < 1:
            raise ValueError(f"Plan.weigh: cuts {cuts} leave a stage of {self.num_blocks} "
                             "blocks empty; give increasing cut points in 1..num_blocks-1")  # fmt: skip
        m = self.num_microbatches if num_microbatches is None else num_microbatches
        microbatch_counts(self.num_ranks, self.setting.batch_size, m)  # >= 1, divides the batch
        costs = _stage_costs(self.blocks, cuts, m, recompute, self.setting)
        chunks = chunks_of(schedule)
        if len(sizes) != chunks * self.num_ranks:
            raise ValueError(f"Plan.weigh: {schedule} on {self.num_ranks} ranks needs "
                             f"{chunks * self.num_ranks} stages; cuts {cuts} make {len(sizes)}")  # fmt: skip
        built = get_schedule(schedule, num_ranks=self.num_ranks, num_microbatches=m, costs=costs)
        return _candidate(schedule, built, costs, cuts, m, recompute, self.setting.memory_limit)

    def naive(self) -> Candidate:
        """The baseline beside the plan: 1F1B on equal block counts per rank, the plan's
        microbatches, no recompute (weighed as :meth:`weigh` does)."""
        return self.weigh(cuts_from_sizes(equal_sizes(self.num_blocks, self.num_ranks)), "1f1b")

    def describe(self, candidate: Candidate) -> dict:
        """``candidate``'s row as ``pp plan`` shows it: stage sizes, schedule, microbatches,
        recompute, predicted step (ms), simulated bubble, peak MiB per rank, whether it fits
        (from the candidate's prediction: nothing is simulated again)."""
        return {
            "stage_sizes": list(sizes_from_cuts(candidate.cuts, self.num_blocks)),
            "schedule": candidate.schedule,
            "num_microbatches": candidate.num_microbatches,
            "recompute": candidate.recompute[0],
            "predicted_step_ms": candidate.predicted_step_ms,
            "bubble_rate": self.simulate(candidate).bubble_rate
            if candidate.predicted_bubble_rate is None  # an older plan file's
            else candidate.predicted_bubble_rate,
            "peak_mib_per_rank": [b / MiB for b in candidate.predicted_peak_bytes],
            "fits": candidate.fits,
        }

    def draw(self, path: str | Path, naive: Candidate | None = None) -> Path:
        """The chosen candidate's simulated step above the :meth:`naive` one's (``naive``, when
        already weighed), on one time axis, each titled with its schedule, stage sizes, m and
        recompute."""
        from nobubble.pipeline.plot import gantt_grid

        sims = []
        for who, c in (("plan", self.chosen), ("naive", naive or self.naive())):
            sim, sizes = self.simulate(c), sizes_from_cuts(c.cuts, self.num_blocks)
            name = (
                f"{who}: {sim.schedule.name}, stages {'+'.join(map(str, sizes))}, "
                f"m={c.num_microbatches}{', recompute' if c.recompute[0] else ''}"
            )
            sims.append(dataclasses.replace(sim, schedule=sim.schedule.renamed(name)))
        return gantt_grid(sims, path)

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @staticmethod
    def read(path: str | os.PathLike[str]) -> Plan:
        """The plan in the JSON file at ``path`` (:meth:`to_json`'s, ``pp plan --model ...
        --out``).

        Raises:
            ValueError: ``path`` cannot be read or holds no plan JSON; the error names the
                file and how to write one.
        """
        text = read_input_text(
            path, "write one with pp plan --model MODULE:FACTORY --out plan.json"
        )
        try:
            return Plan.from_json(text)
        except (KeyError, TypeError, ValueError, RecursionError) as err:  # JSONDecodeError too
            raise ValueError(f"{path}: not a plan JSON (pp plan --model ... --out): "
                             f"{type(err).__name__}: {err}") from None  # fmt: skip

    @staticmethod
    def from_json(text: str) -> Plan:
        d = json.loads(text)

        def cand(c: dict) -> Candidate:
            return Candidate(**{**c, "cuts": tuple(c["cuts"]), "recompute": tuple(c["recompute"]),
                                "predicted_peak_bytes": tuple(c["predicted_peak_bytes"])})  # fmt: skip

        return Plan(
            blocks=tuple(BlockCosts(**b) for b in d["blocks"]), setting=Setting(**d["setting"]),
            chosen=cand(d["chosen"]), candidates=tuple(cand(c) for c in d["candidates"]),
        )  # fmt: skip


def plan_from_costs(
    blocks: Sequence[BlockCosts],
    *,
    num_ranks: int,
    batch_size: int | None = None,
    num_microbatches: int | Sequence[int] | None = None,
    microbatch_size: int | None = None,
    schedules: str | Sequence[str] = "auto",
    recompute: bool | str = "auto",
    memory_limit: float | None = None,
    first_stage_input_grad: bool = False,
    comm_ms_per_byte: float = 0.0,
    input_bytes: float = 0.0,
    op_overhead_ms: float = 0.0,
    tolerance: float = 0.02,
    max_exhaustive_cuts: int = 200,
    cuts: Sequence[Sequence[int]] | None = None,
    ilp_time_limit_s: float | None = None,
) -> Plan:
    """Choose the cut, schedule, microbatch count and recompute for ``blocks`` on
    ``num_ranks`` ranks: of the candidates whose peak fits ``memory_limit`` and whose step is
    predicted within ``tolerance`` of the fastest, the one with the least peak.

    Args:
        blocks: one :class:`BlockCosts` per block, in pipeline order (ms, bytes per microbatch
            of ``microbatch_size`` rows).
        batch_size: rows per step; with it, each microbatch count ``m`` scales the block
            costs linearly to ``batch_size / m`` rows (``microbatch_size`` is then required
            when more than one count is weighed).
        num_microbatches: a count or counts to weigh; None: the divisors of ``batch_size``
            from ``num_ranks`` to ``4 * num_ranks``, the largest four at most (kept small:
            each count multiplies the search).
        schedules: registry names, or ``"auto"`` (see the module docstring).
        recompute: False, True (every stage recomputes) or ``"auto"`` (both weighed). The
            simulator's cost model recomputes all stages or none, so ``Plan.recompute`` is
            per stage but uniform for now.
        memory_limit: peak activation bytes allowed per rank; None: no limit.
        first_stage_input_grad: whether the model's input needs a gradient (see
            :func:`stage_costs`); ``comm_ms_per_byte``, ``input_bytes``,
            ``op_overhead_ms``: likewise.
        tolerance: candidates predicted within this fraction of the fastest count as fast
            (a prediction is not exact); of those that fit, the one with the least peak
            memory is chosen (then the fastest).
        max_exhaustive_cuts: weigh every contiguous cut when there are at most this many.
        cuts: weigh only these (pinned) cuts of ``num_ranks`` or ``2 * num_ranks`` stages, not
            :func:`candidate_cuts`; the first of one stage per rank is the min-bottleneck's.
        ilp_time_limit_s: also weigh the exact solver's least-makespan schedule (no recompute)
            on that first cut, searching this long for each microbatch count.

    Raises:
        ValueError: bad input (before any search), or no candidate fits ``memory_limit``.
    """
    for i, b in enumerate(blocks):
        if not isinstance(b, BlockCosts):
            raise ValueError(f"plan: block {i} is a {type(b).__name__}, not BlockCosts")
    counts, names, flags = check_inputs(
        len(blocks), num_ranks, batch_size, num_microbatches, microbatch_size, schedules,
        recompute, memory_limit, comm_ms_per_byte, input_bytes, op_overhead_ms, tolerance,
        ilp_time_limit_s=ilp_time_limit_s,
    )  # fmt: skip
    setting = Setting(num_ranks, batch_size, microbatch_size, first_stage_input_grad,
                      comm_ms_per_byte, input_bytes, memory_limit, op_overhead_ms)  # fmt: skip
    given = None if cuts is None else pinned_cuts(cuts, names, num_ranks, len(blocks))
    found: list[Candidate | None] = []
    dp_cut: tuple[int, ...] = ()
    for chunks in sorted({chunks_of(n) for n in names} | {1}):
        all_cuts = given[chunks] if given is not None else candidate_cuts(
            blocks, chunks * num_ranks, max_exhaustive_cuts=max_exhaustive_cuts)  # fmt: skip
        tried = tuple(n for n in names if chunks_of(n) == chunks)
        dp_cut = all_cuts[0] if chunks == 1 else dp_cut
        for m, rc, cut in itertools.product(counts, flags, all_cuts):
            weighed = tried
            if chunks == 1 and "1f1b" not in names and cut == all_cuts[0]:
                weighed = ("1f1b", *tried)  # 1F1B on the min-bottleneck cut: the floor to beat
            found.extend(_weighed(blocks, cut, m, rc, weighed, setting))
    if ilp_time_limit_s is not None:  # the exact solver's schedule on the first cut
        found.extend(_exact(blocks, dp_cut, m, setting, ilp_time_limit_s) for m in counts)
    ranked = tuple(sorted((c for c in found if c is not None), key=Candidate.sort_key))
    chosen = _choose(ranked, dp_cut, tolerance, memory_limit)
    return Plan(blocks=tuple(blocks), setting=setting, chosen=chosen, candidates=ranked)


def _weighed(blocks: Sequence[BlockCosts], cut: tuple[int, ...], m: int, rc: bool,
             names: Sequence[str], setting: Setting) -> Iterator[Candidate]:  # fmt: skip
    """Each of ``names`` on ``cut`` with ``m`` microbatches and recompute ``rc``, simulated."""
    costs = _stage_costs(blocks, cut, m, rc, setting)  # one per (cut, m, recompute)
    for name in names:
        try:
            built = get_schedule(name, num_ranks=setting.num_ranks, num_microbatches=m,
                                 costs=costs)  # fmt: skip
        except ValueError:  # (p, m) outside the generator's domain (m % p != 0)
            continue
        yield _candidate(name, built, costs, cut, m, rc, setting.memory_limit)


def _choose(ranked: tuple[Candidate, ...], dp_cut: tuple[int, ...], tolerance: float,
            memory_limit: float | None) -> Candidate:  # fmt: skip
    """Of the candidates that fit and are predicted within ``tolerance`` of the fastest (and
    no slower than 1F1B on the min-bottleneck cut ``dp_cut``), the one with the least peak."""
    fitting = [c for c in ranked if c.fits]
    if not fitting:
        least = min(ranked, key=lambda c: max(c.predicted_peak_bytes))
        raise ValueError(f"plan: no candidate fits memory_limit={memory_limit:g} bytes per rank;"
                         f" the smallest predicted peak is {max(least.predicted_peak_bytes):g} "
                         f"bytes ({least.schedule}, cuts {least.cuts}, m={least.num_microbatches}"
                         f", recompute={least.recompute[0]}); allow recompute, use more ranks "
                         "or more microbatches, or raise memory_limit")  # fmt: skip
    # within the tolerance of the fastest, and never slower than 1F1B on the min-bottleneck cut
    floor = min((c.predicted_step_ms for c in fitting if c.schedule == "1f1b"
                 and c.cuts == dp_cut), default=math.inf)  # fmt: skip
    bound = min(fitting[0].predicted_step_ms * (1 + tolerance), floor)
    fast = [c for c in fitting if c.predicted_step_ms <= bound]  # holds fitting[0]
    chosen = min(fast, key=lambda c: (max(c.predicted_peak_bytes), c.sort_key()))
    return chosen


def _stage_costs(blocks: Sequence[BlockCosts], cut: Sequence[int], num_microbatches: int,
                 recompute: bool, setting: Setting) -> CostModel:  # fmt: skip
    return stage_costs(
        blocks, cut, first_stage_input_grad=setting.first_stage_input_grad,
        comm_ms_per_byte=setting.comm_ms_per_byte, input_bytes=setting.input_bytes,
        op_overhead_ms=setting.op_overhead_ms,
        scale=setting.scale(num_microbatches), recompute=recompute,
    )  # fmt: skip


def _build(blocks: Sequence[BlockCosts], cand: Candidate,
           setting: Setting) -> tuple[CostModel, Schedule]:  # fmt: skip
    """``cand``'s stage costs and its schedule, built from them as the search built it."""
    costs = _stage_costs(blocks, cand.cuts, cand.num_microbatches, cand.recompute[0], setting)
    if cand.actions is not None:
        return costs, Schedule.from_csv(cand.actions, name=cand.schedule)
    return costs, get_schedule(cand.schedule, num_ranks=setting.num_ranks,
                               num_microbatches=cand.num_microbatches, costs=costs)  # fmt: skip


def _exact(blocks: Sequence[BlockCosts], cut: tuple[int, ...], m: int, setting: Setting,
           seconds: float) -> Candidate | None:  # fmt: skip
    """The exact solver's least-makespan schedule on ``cut`` within the memory limit (None:
    none found in time, or none fits)."""
    from nobubble.pipeline.ilp.solve import solve_optimal

    costs = _stage_costs(blocks, cut, m, False, setting)
    res = solve_optimal(costs, num_stages=setting.num_ranks, num_microbatches=m,
                        mem_limit=setting.memory_limit, objective="makespan",
                        time_limit_s=seconds)  # fmt: skip
    if res.schedule is None:
        return None
    sched = res.schedule.renamed(f"ilp-{res.status}")
    cand = _candidate(sched.name, sched, costs, cut, m, False, setting.memory_limit)
    return dataclasses.replace(cand, actions=sched.to_csv())


def _candidate(name: str, schedule: Schedule, costs: CostModel, cut, m, rc,
               memory_limit) -> Candidate:  # fmt: skip
    """``schedule`` (registry ``name``, built from ``costs``) simulated: its prediction."""
    result = simulate(schedule, costs)
    peak = tuple(float(x) for x in result.peak_memory)
    fits = memory_limit is None or max(peak) <= memory_limit
    return Candidate(cuts=tuple(cut), schedule=name, num_microbatches=m,
                     recompute=(rc,) * len(costs.t_f), predicted_step_ms=float(result.makespan),
                     predicted_peak_bytes=peak, fits=fits,
                     predicted_bubble_rate=float(result.bubble_rate))  # fmt: skip
