"""Tables of pp's results: a simulated schedule's ranks, the comparison of every schedule
(and its line on ZB-2p's claim), the exact solver's rows, the bubble-memory frontier;
``pp profile``'s stage costs, ``pp plan``'s candidates (a built-in model's schedules, or a
plan of the user's own model beside the naive one), ``pp run``'s measured step beside the
simulated one, and a plan's training steps. A ``*_table`` function returns
:func:`~nobubble.bench.output.print_table`'s keywords; the result types stay free of text."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from nobubble.bench.output import console, print_table
from nobubble.pipeline.plan_inputs import MiB

__all__ = [
    "compare_table",
    "frontier_table",
    "plan_run_table",
    "print_plan",
    "print_user_plan",
    "profile_table",
    "run_table",
    "simulate_table",
    "solve_table",
    "zb2p_claim",
]


def profile_table(prof: Any) -> dict[str, Any]:
    """``pp profile``'s table of a :class:`~nobubble.pipeline.runtime.profile_data.Profile`:
    each stage's blocks, op times (ms), split-backward overhead and memory (MiB)."""
    rows = [
        [s.stage, f"{s.blocks[0]}-{s.blocks[-1]}", s.t_f, s.t_b, s.t_w, s.t_b + s.t_w,
         s.t_bw_fused, f"{s.split_overhead:+.1%}", s.mem_f / MiB, s.mem_w / MiB]
        for s in prof.stages
    ]  # fmt: skip
    columns = ["stage", "blocks", "T_F", "T_B", "T_W", "T_B+T_W", "fused BW", "split", "M_F", "M_W"]
    title = f"{prof.model}: {len(prof.stages)} stages, microbatch {prof.microbatch_size} (ms, MiB)"
    caption = f"T_comm {prof.t_comm:.3f} ms; {prof.clock} clock"
    return {"title": title, "columns": columns, "rows": rows, "caption": caption}


def simulate_table(result: Any, run: Any, mem_f: float) -> dict[str, Any]:
    """``pp simulate``'s table of a :class:`~nobubble.pipeline.simulate.SimResult` (and of its
    dispatch ``run``, None under the static policy): each rank's span, busy time, bubble and
    peak memory in units of ``mem_f``."""
    sched = result.schedule
    rows = [
        [r, result.spans[r], result.busy[r], f"{result.rank_bubble_rates[r]:.1%}",
         result.peak_memory[r] / mem_f, f"{result.peak_memory_vs_1f1b[r]:.2f}x"]
        for r in range(sched.num_ranks)
    ]  # fmt: skip
    return {
        "title": f"{sched.name}: P={sched.num_ranks}, M={sched.num_microbatches}"
        + (f", {run.describe(mem_f)}" if run is not None else ""),
        "columns": ["rank", "span", "busy", "bubble", "peak mem (M_F)", "vs 1F1B"],
        "rows": rows,
        "caption": f"bubble rate {result.bubble_rate:.2%} (max span {result.max_span:.4g}), "
        f"makespan {result.makespan:.4g}",
    }


def solve_table(result: Any, num_ranks: int, num_microbatches: int) -> dict[str, Any]:
    """``pp solve``'s table of a :class:`~nobubble.pipeline.ilp.common.SolveResult` of
    ``num_ranks`` ranks (each of ``result.num_chunks`` stages) and ``num_microbatches``
    microbatches under its activation limit: the schedule, its status and figures."""
    limit = "none" if result.mem_limit is None else f"{result.mem_limit:g}"
    shape = "" if result.num_chunks == 1 else f", {result.num_chunks} chunks ({result.placement})"
    kind = result.objective_kind
    rows = []  # the warm start (when one fitted), then the solver's row; "-" for none
    if result.heuristic:
        rows.append([f"heuristic {result.heuristic}", "-", result.heuristic_objective,
                     result.heuristic_bubble_rate, "-", "-", "-"])  # fmt: skip
    gap = None if result.gap is None else f"{result.gap:.2%}"
    rows.append(["ilp (cp-sat)", result.status, result.objective, result.bubble_rate,
                 result.lower_bound, gap, f"{result.solve_seconds:.1f}"])  # fmt: skip
    return {
        "title": f"pp solve: p={num_ranks}, m={num_microbatches}{shape}, {kind}, mem limit {limit}",
        "columns": ["schedule", "status", kind, "bubble", "lower bound", "gap", "seconds"],
        "rows": [[("-" if v is None else v) for v in row] for row in rows],
        "caption": result.explanation,
    }


def compare_table(rows: Sequence[Any], costs: dict, num_ranks: int,
                  num_microbatches: int) -> dict[str, Any]:  # fmt: skip
    """``pp compare``'s table of :class:`~nobubble.pipeline.compare.CompareRow` ``rows`` on
    the per-rank ``costs`` (:func:`~nobubble.pipeline.compare.cost_summary`'s): each
    schedule's bubble, peak memory and both throughputs against 1F1B (dashes when not built)."""
    times = [",".join(f"{v:g}" for v in costs[k]) if isinstance(costs[k], list)
             else f"{costs[k]:g}" for k in ("t_f", "t_b", "t_w")]  # fmt: skip

    def figures(r: Any) -> list[str]:
        if r.result is None:
            return ["-"] * 4
        return [f"{r.result.bubble_rate:.2%}", f"{r.result.max_peak_memory_vs_1f1b:.2f}x",
                f"{r.throughput_vs_1f1b:.3f}x", f"{r.throughput_vs_1f1b_flush:.3f}x"]  # fmt: skip

    return {
        "title": f"P={num_ranks}, M={num_microbatches}: T_F={times[0]} T_B={times[1]} "
        f"T_W={times[2]} T_comm={costs['t_comm']:g} (per rank)",
        "columns": ["schedule", "from", "kind", "bubble", "peak mem", "throughput",
                    "with flush", "note"],
        "rows": [[r.name, r.source, r.kind, *figures(r), r.note] for r in rows],
        "caption": "bubble = (max span - M(F+B+W)) / max span; peak memory and throughput "
        "relative to 1F1B; throughput = 1F1B max span / max span (steps overlap, as in the "
        "paper), with flush = 1F1B makespan / makespan",
    }  # fmt: skip


def zb2p_claim(rows: Sequence[Any]) -> str | None:
    """ZB-2p's throughput gain over 1F1B in the comparison ``rows`` against the commonly
    quoted 15-30% (None: no zb-2p row)."""
    zb2p = next((r.throughput_vs_1f1b for r in rows if r.name == "zb-2p"), None)
    if zb2p is None:
        return None
    verdict = "inside" if 0.15 <= zb2p - 1 <= 0.30 else "outside"
    return (f"ZB-2p over 1F1B: {zb2p - 1:+.1%} throughput ({verdict} the commonly quoted 15-30% "
            "claim for P=8, M=24)")  # fmt: skip


def frontier_table(result: Any) -> dict[str, Any]:
    """``pp frontier``'s table of a :class:`~nobubble.pipeline.frontier.Frontier`: each point
    by memory then bubble (missing points last), ``*`` on the Pareto-optimal ones."""
    points = sorted(result.points, key=lambda q: (not q.ok, q.peak_memory, q.bubble_rate))
    return {
        "title": f"P={result.num_ranks}, M={result.num_microbatches}: bubble vs peak "
        "activation memory",
        "columns": ["schedule", "from", "peak mem", "bubble", "pareto", "note"],
        "rows": [
            [q.name, q.source, *([f"{q.peak_memory:.2f}", f"{q.bubble_rate:.2%}"] if q.ok
                                 else ["-", "-"]), "*" if q.pareto else "", q.note]
            for q in points
        ],
        "caption": "peak memory in microbatches of one rank's activations (1F1B: P); "
        f"* = Pareto-optimal; {result.seconds:.1f} s",
    }  # fmt: skip


def _print_candidates(title: str, rows: list[tuple[str, dict]], *, naive_ms: float | None,
                      limited: bool, caption: str) -> None:  # fmt: skip
    """The table of a plan's candidates (each row :meth:`Plan.describe`'s, after its label),
    with each one's speed-up over the naive plan's ``naive_ms`` and (``limited``) whether it
    fits."""
    table = [
        [label, "+".join(map(str, r["stage_sizes"])), r["schedule"], r["num_microbatches"],
         "yes" if r["recompute"] else "no", r["predicted_step_ms"], f"{r['bubble_rate']:.1%}",
         " / ".join(f"{b:.3g}" for b in r["peak_mib_per_rank"]),
         *([f"{naive_ms / r['predicted_step_ms']:.2f}x"] if naive_ms else []),
         *(["yes" if r["fits"] else "no"] if limited else [])]
        for label, r in rows
    ]  # fmt: skip
    columns = ["", "stage sizes", "schedule", "m", "recompute", "step ms", "bubble",
               "peak MiB per rank", *(["vs naive"] if naive_ms else []),
               *(["fits"] if limited else [])]  # fmt: skip
    print_table(title, columns, table, caption=caption)


def print_plan(p: Any, rows: list[dict], source: str, out: Path, *, limited: bool) -> None:
    """``pp plan``'s table of a built-in model's :class:`~nobubble.pipeline.plan.Plan`: every
    candidate schedule (``rows``, :meth:`Plan.describe`'s) on ``source``'s profiled costs."""
    _print_candidates(
        f"P={p.num_ranks}, M={p.num_microbatches}, profiled costs ({source})",
        [("chosen" if c == p.chosen else str(i + 1), r)
         for i, (c, r) in enumerate(zip(p.candidates, rows, strict=True))],
        naive_ms=None, limited=limited,
        caption=f"best: {p.schedule_name}"
        + (" (run it with --recompute)" if p.recompute[0] else "") + f" -> {out}",
    )  # fmt: skip


def print_user_plan(
    p: Any,
    spec: str,
    rows: list[dict],
    naive: dict,
    out: Path,
    plot: Path,
    *,
    threads: int,
    limited: bool,
) -> None:
    """``pp plan --model MODULE:FACTORY``'s line on the plan ``p`` of the factory ``spec`` and
    the table of the candidates' ``rows`` and the ``naive`` plan's (:meth:`Plan.describe`'s),
    profiled with ``threads`` per rank; ``out``, ``plot``: the plan's JSON and its chart."""
    naive_ms = naive["predicted_step_ms"]
    console().print(  # the factory's name as written: no markup, no :emoji: codes
        f"{spec}: plan for {p.num_blocks} blocks on {p.num_ranks} ranks: stages "
        f"{'+'.join(map(str, p.stage_sizes()))}, {p.schedule_name}, m={p.num_microbatches}, "
        f"recompute {'on' if p.recompute[0] else 'off'}; predicted {p.predicted_step_ms:.4g} ms "
        f"a step, {naive_ms / p.predicted_step_ms:.2f}x the naive plan's {naive_ms:.4g} ms",
        markup=False, emoji=False,
    )  # fmt: skip
    _print_candidates(
        f"the chosen plan and the next of {len(p.candidates)} candidates weighed",
        [*[("chosen" if i == 0 else str(i + 1), r) for i, r in enumerate(rows)], ("naive", naive)],
        naive_ms=naive_ms, limited=limited,
        caption="predicted by the simulator from each block's costs, profiled once here "
        f"({threads} thread(s)); naive: equal blocks per rank, 1F1B, the same m, no recompute; "
        f"wrote {out}, {plot}",
    )  # fmt: skip


def run_table(s: Any, files: dict[str, str]) -> dict[str, Any]:
    """``pp run``'s table of a :class:`~nobubble.pipeline.runtime.report.RunSummary`: the
    measured step beside the simulated one (when predicted), naming the ``files`` written."""
    pred = s.sim_makespan_s is not None  # the simulated figures come together, or none
    rows = [
        ["step makespan (ms)", s.makespan_s * 1e3, s.sim_makespan_s * 1e3 if pred else "-"],
        ["step time incl. optimizer (ms)", s.step_time_s * 1e3, "-"],
        ["bubble rate", f"{s.bubble_rate:.1%}", f"{s.sim_bubble_rate:.1%}" if pred else "-"],
    ]
    for r, b in enumerate(s.peak_activation_bytes):
        p = s.sim_peak_activation_bytes[r] / MiB if pred else "-"
        rows.append([f"peak activations rank {r} (MiB)", b / MiB, p])
    rows.append(["loss first -> last step", f"{s.losses[0]:.4f} -> {s.losses[-1]:.4f}", "-"])
    return {
        "title": f"{s.schedule}: {s.num_ranks} ranks, {s.num_stages} stages, "
        f"M={s.num_microbatches}, median of {s.num_steps} steps",
        "columns": ["", "measured", "simulated"],
        "rows": rows,
        "caption": ", ".join(f"{k}: {v}" for k, v in files.items()),
    }


def plan_run_table(p: Any, path: Path, run: Any) -> dict[str, Any]:
    """``pp run --plan``'s table of the :class:`~nobubble.pipeline.plan.Plan` at ``path`` and
    its :class:`~nobubble.pipeline.runtime.planning.train.PlanRun`: each step's loss and time
    beside the predicted one."""
    measured, num_steps = run.median_step_ms, len(run.step_ms)
    return {
        "title": f"{path}: {p.schedule_name}, stages {'+'.join(map(str, p.stage_sizes()))}, "
        f"m={p.num_microbatches}, recompute {'on' if p.recompute[0] else 'off'}, "
        f"{p.num_ranks} ranks",
        "columns": ["step", "loss", "step ms", "predicted ms"],
        "rows": [
            [i, f"{loss:.6g}", ms, p.predicted_step_ms]
            for i, (loss, ms) in enumerate(zip(run.losses, run.step_ms, strict=True))
        ],
        "caption": f"median step {measured:.4g} ms"
        + (" (after the first)" if num_steps > 1 else "")
        + f" = {measured / p.predicted_step_ms:.2f}x the predicted {p.predicted_step_ms:.4g} ms",
    }
