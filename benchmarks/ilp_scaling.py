"""Exact ILP (CP-SAT) against the heuristic schedules as the pipeline grows.

Three tables, one JSON (``benchmarks/results/ilp_scaling.json``):

1. grid: p in {2, 3, 4}, m in {p, 2p}, uniform (the paper's 1.5B costs on every stage) and
   per-stage non-uniform costs (first stage x1.25 for the embedding, last x1.5 for the head
   and loss), without and with the ZB-1p memory limit p*M_F. Baseline in the same run: the
   best heuristic (zb-1p, zb-2p, zb-h1, zb-h2, 1f1b) that fits the limit.
2. scaling: P = 8 with the 1.5B costs, M = 8, 16, 24 under p*M_F (ZB-1p's limit), and
   M = 24 under 6 and 4 M_F, 120 s each: solve time, gap, span and bubble against zb-1p.
3. memory sweep: p = 3, m = 6 and p = 4, m = 8 (uniform and non-uniform) under limits from
   1 M_F to 2p M_F, against zb-1p run with the same limit (the heuristic's own argument).
   Below p*M_F (a pipeline that cannot hold 1F1B's activations) the heuristic falls far
   behind the optimum.
4. solvers: the same model (no warm start) in CP-SAT and as the paper's big-M MILP in
   HiGHS and SCIP (``nobubble.pipeline.ilp.milp``), equal time limit.
5. chunks_grid: two chunks per rank (V and interleaved placements), p = 3, m = 6 and
   p = 4, m = 8, 1.5B costs split over the chunks, no limit and p*M_F, 60 s each.
6. chunks_p8: P = 8, M = 24, the paper's 1.5B and 6.2B costs, two chunks per rank, under
   1F1B's peak (p M_F, against ZB-V), about 1/2 of it (against V-Half) and about 1/3
   (against V-Min). Each limit is ``max(fraction * p, the baseline's own peak)`` M_F, so the
   baseline fits and is the warm start; the row records both. ``--chunks-only`` runs just
   sections 5 and 6 and merges them into the existing JSON; ``--chunk-time-limit`` sets
   the P = 8 limit (default 600 s).

``--plot DIR`` also draws zb-1p and the ILP optimum for p = 4, m = 8 under 3 M_F.

``--quick`` runs a few cases with short limits. Timing is wall clock on this machine; other
jobs may share its cores (the JSON records the number of workers and the load average).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from rich.progress import Progress

from benchmarks._common import write_record
from benchmarks.records.ilp_scaling import IlpScaling
from nobubble.bench.output import console, print_table
from nobubble.pipeline.costs import CostModel
from nobubble.pipeline.ilp.milp import solve_milp
from nobubble.pipeline.ilp.model import build_cpsat
from nobubble.pipeline.ilp.solve import (
    DEFAULT_WORKERS,
    HEURISTIC_NAMES,
    solve_optimal,
    to_int_problem,
)
from nobubble.pipeline.schedules import get_schedule
from nobubble.pipeline.simulate import simulate

PAPER_1_5B = {"t_f": 18.522, "t_b": 18.086, "t_w": 9.337, "t_comm": 0.601}
MEMORY_1_5B = {"hidden": 2304, "heads": 24, "seq": 1024}


def costs_for(p: int, kind: str) -> CostModel:
    """1.5B costs on every stage ("uniform") or with a heavier first and last stage."""
    uniform = CostModel.paper(p, **PAPER_1_5B, **MEMORY_1_5B)
    if kind == "uniform":
        return uniform
    scale = [1.25 if s == 0 else 1.5 if s == p - 1 else 1.0 for s in range(p)]
    times = {
        k: tuple(round(getattr(uniform, k)[s] * scale[s], 3) for s in range(p))
        for k in ("t_f", "t_b", "t_w")
    }
    return CostModel(
        **times, t_comm=uniform.t_comm, mem_f=uniform.mem_f, mem_b=uniform.mem_b,
        mem_w=uniform.mem_w,
    )  # fmt: skip


def best_heuristic(
    costs: CostModel, p: int, m: int, limit: float | None
) -> tuple[str, float, float]:
    """(name, span, bubble) of the best heuristic whose peak memory fits ``limit``."""
    best = ("", float("inf"), 0.0)
    for name in HEURISTIC_NAMES:
        kw = {"mem_limit": limit} if limit is not None and name in ("zb-1p", "zb-2p") else {}
        sim = simulate(
            get_schedule(name, num_ranks=p, num_microbatches=m, costs=costs, **kw), costs
        )
        if limit is not None and max(sim.peak_memory) > limit * (1 + 1e-12):
            continue
        if sim.max_span < best[1]:
            best = (name, sim.max_span, sim.bubble_rate)
    return best


def ilp_row(costs, p, m, limit, time_limit, workers, label) -> dict:
    heur = best_heuristic(costs, p, m, limit)
    res = solve_optimal(
        costs, num_stages=p, num_microbatches=m, mem_limit=limit, time_limit_s=time_limit,
        num_workers=workers,
    )  # fmt: skip
    return {
        "case": label, "p": p, "m": m, "mem_limit": limit,
        "heuristic": heur[0], "heuristic_span": heur[1], "heuristic_bubble": heur[2],
        "status": res.status, "ilp_span": res.objective, "ilp_bubble": res.bubble_rate,
        "lower_bound": res.lower_bound, "gap": res.gap, "solve_seconds": res.solve_seconds,
        "span_reduction": (heur[1] - res.objective) / heur[1],
    }  # fmt: skip


def grid(quick: bool, time_limit: float, workers: int, progress: Progress) -> list[dict]:
    cases = [
        (p, m, kind, lim)
        for p in (2, 3, 4)
        for m in (p, 2 * p)
        for kind in ("uniform", "non-uniform")
        for lim in (False, True)
    ]
    if quick:
        cases = [c for c in cases if c[0] <= 3 and c[1] == c[0]]
    task = progress.add_task("grid", total=len(cases))
    rows = []
    for p, m, kind, lim in cases:
        costs = costs_for(p, kind)
        limit = p * costs.mem_f[0] if lim else None
        label = f"p={p} m={m} {kind} {'p*M_F' if lim else 'no limit'}"
        rows.append(ilp_row(costs, p, m, limit, time_limit, workers, label))
        progress.advance(task)
    return rows


def scaling(quick: bool, time_limit: float, workers: int, progress: Progress) -> list[dict]:
    # (P, M, limit in M_F): ZB-1p's p*M_F as M grows, then tighter limits at M = 24
    sizes = [(8, 8, 8)] if quick else [(8, 8, 8), (8, 16, 8), (8, 24, 8), (8, 24, 6), (8, 24, 4)]
    task = progress.add_task("scaling P=8", total=len(sizes))
    rows = []
    for p, m, k in sizes:
        costs = costs_for(p, "uniform")
        label = f"P={p} M={m} {k} M_F"
        rows.append(ilp_row(costs, p, m, k * costs.mem_f[0], time_limit, workers, label))
        progress.advance(task)
    return rows


def memory_sweep(quick: bool, time_limit: float, workers: int, progress: Progress) -> list[dict]:
    shapes = [(3, 6)] if quick else [(3, 6), (4, 8)]
    kinds = ["uniform"] if quick else ["uniform", "non-uniform"]
    cases = [
        (p, m, kind, k)
        for p, m in shapes
        for kind in kinds
        for k in sorted({1, 1.5, 2, 3, p + 1, 2 * p})
    ]
    task = progress.add_task("memory sweep", total=len(cases))
    rows = []
    for p, m, kind, k in cases:
        costs = costs_for(p, kind)
        label = f"p={p} m={m} {kind} {k:g} M_F"
        row = ilp_row(costs, p, m, k * costs.mem_f[0], time_limit, workers, label)
        row["mem_limit_MF"] = k
        rows.append(row)
        progress.advance(task)
    return rows


def plot_pair(out_dir: Path, time_limit: float, workers: int) -> list[Path]:
    """zb-1p and the ILP optimum for p=4, m=8, 1.5B costs, limit 3 M_F (Gantt PNGs)."""
    from nobubble.pipeline.plot import gantt

    p, m = 4, 8
    costs = costs_for(p, "uniform")
    limit = 3 * costs.mem_f[0]
    heuristic = simulate(
        get_schedule("zb-1p", num_ranks=p, num_microbatches=m, costs=costs, mem_limit=limit),
        costs,
    )
    res = solve_optimal(
        costs, num_stages=p, num_microbatches=m, mem_limit=limit, time_limit_s=time_limit,
        num_workers=workers,
    )  # fmt: skip
    return [
        gantt(heuristic, out_dir / "ilp_zb1p_p4m8_3mf.png", title="zb-1p, limit 3 M_F"),
        gantt(
            res.simulation,
            out_dir / "ilp_optimal_p4m8_3mf.png",
            title=f"ILP ({res.status}), limit 3 M_F",
        ),  # fmt: skip
    ]


def solvers(quick: bool, time_limit: float, workers: int, progress: Progress) -> list[dict]:
    sizes = [(3, 3), (3, 6)] if quick else [(3, 3), (3, 6), (4, 4), (4, 8)]
    task = progress.add_task("cp-sat vs milp", total=len(sizes) * 3)
    rows = []
    for p, m in sizes:
        costs = costs_for(p, "uniform")
        problem, unit, _ = to_int_problem(
            costs, num_microbatches=m, mem_limit=p * costs.mem_f[0], objective="span"
        )
        row = {"case": f"p={p} m={m} p*M_F", "p": p, "m": m}
        from ortools.sat.python import cp_model

        built = build_cpsat(problem)
        solver = cp_model.CpSolver()
        solver.parameters.max_time_in_seconds = time_limit
        solver.parameters.num_workers = workers
        t0 = time.perf_counter()
        code = solver.solve(built.model)
        row["cpsat_seconds"] = time.perf_counter() - t0
        row["cpsat_status"] = solver.status_name(code).lower()
        row["cpsat_span"] = solver.objective_value * unit
        progress.advance(task)
        for name in ("HIGHS", "SCIP"):
            res = solve_milp(problem, solver=name, time_limit_s=time_limit)
            key = name.lower()
            row[f"{key}_seconds"], row[f"{key}_status"] = res.seconds, res.status
            row[f"{key}_span"] = None if res.objective is None else res.objective * unit
            row["binaries"] = res.num_binaries
            progress.advance(task)
        rows.append(row)
    return rows


PAPER_6_2B = {"t_f": 29.718, "t_b": 29.444, "t_w": 19.927, "t_comm": 0.527}
MEMORY_6_2B = {"hidden": 4096, "heads": 32, "seq": 1024}
CHUNK_LEVELS = (("1x", 1.0, "zb-v"), ("1/2", 0.5, "v-half"), ("1/3", 1 / 3, "v-min"))


def chunk_row(costs, p, m, placement, limit, time_limit, workers, label, baseline) -> dict:
    """One two-chunk solve against ``baseline`` (a schedule name, or None)."""
    base = None
    if baseline is not None:
        base = simulate(get_schedule(baseline, num_ranks=p, num_microbatches=m, costs=costs),
                        costs)  # fmt: skip
    res = solve_optimal(
        costs, num_stages=p, num_microbatches=m, num_chunks=2, placement=placement,
        mem_limit=limit, time_limit_s=time_limit, num_workers=workers,
    )  # fmt: skip
    unit = costs.mem_f[0]
    return {
        "case": label, "p": p, "m": m, "placement": placement,
        "mem_limit_MF": None if limit is None else limit / unit,
        "baseline": baseline, "baseline_span": None if base is None else base.max_span,
        "baseline_bubble": None if base is None else base.bubble_rate,
        "baseline_peak_MF": None if base is None else max(base.peak_memory) / unit,
        "heuristic": res.heuristic, "heuristic_span": res.heuristic_objective,
        "heuristic_bubble": res.heuristic_bubble_rate,
        "status": res.status, "ilp_span": res.objective, "ilp_bubble": res.bubble_rate,
        "ilp_peak_MF": max(res.peak_memory) / unit if res.peak_memory else None,
        "lower_bound": res.lower_bound, "gap": res.gap, "solve_seconds": res.solve_seconds,
        "time_limit_s": time_limit, "workers": workers,
        # the least bubble any schedule of this placement can have under the limit: work / bound
        "bubble_lower_bound": None if res.lower_bound is None else max(
            0.0, 1 - max(res.simulation.busy) / res.lower_bound),
    }  # fmt: skip


def chunks_grid(quick: bool, time_limit: float, workers: int, progress: Progress) -> list[dict]:
    shapes = [(2, 4)] if quick else [(3, 6), (4, 8)]
    cases = [(p, m, pl, lim) for p, m in shapes for pl in ("v", "interleaved")
             for lim in (False, True)]  # fmt: skip
    task = progress.add_task("two chunks", total=len(cases))
    rows = []
    for p, m, placement, lim in cases:
        costs = costs_for(p, "uniform")
        limit = p * costs.mem_f[0] if lim else None
        label = f"p={p} m={m} {placement} {'p*M_F' if lim else 'no limit'}"
        baseline = "zb-v" if placement == "v" else None
        rows.append(chunk_row(costs, p, m, placement, limit, time_limit, workers, label, baseline))
        progress.advance(task)
    return rows


def chunks_p8(quick: bool, time_limit: float, workers: int, progress: Progress) -> list[dict]:
    p, m = (4, 8) if quick else (8, 24)
    models = {"1.5B": (PAPER_1_5B, MEMORY_1_5B), "6.2B": (PAPER_6_2B, MEMORY_6_2B)}
    task = progress.add_task(f"two chunks P={p}", total=2 * len(CHUNK_LEVELS))
    rows = []
    for model, (times_, memory) in models.items():
        costs = CostModel.paper(p, **times_, **memory)
        for level, fraction, baseline in CHUNK_LEVELS:
            base = simulate(get_schedule(baseline, num_ranks=p, num_microbatches=m, costs=costs),
                            costs)  # fmt: skip
            units = max(fraction * p, max(base.peak_memory) / costs.mem_f[0])
            label = f"{model} P={p} M={m} v, {level} 1F1B memory ({units:.3g} M_F)"
            row = chunk_row(costs, p, m, "v", units * costs.mem_f[0], time_limit, workers,
                            label, baseline)  # fmt: skip
            row.update(model=model, level=level)
            rows.append(row)
            progress.advance(task)
    return rows


def _show_chunks(rows) -> None:
    def fmt(v, spec):
        return "-" if v is None else format(v, spec)

    print_table(
        "two chunks per rank: ILP vs the published V schedules",
        ["case", "baseline", "base bubble", "status", "ilp bubble", "bubble bound", "gap",
         "seconds"],
        [[r["case"], r["baseline"] or r["heuristic"],
          fmt(r["baseline_bubble"] if r["baseline"] else r["heuristic_bubble"], ".2%"),
          r["status"], fmt(r["ilp_bubble"], ".2%"), fmt(r["bubble_lower_bound"], ".2%"),
          fmt(r["gap"], ".2%"), fmt(r["solve_seconds"], ".1f")] for r in rows],
    )  # fmt: skip


def run_chunks(args) -> int:
    """Sections 5 and 6 only, merged into the JSON at ``args.out``."""
    record = json.loads(args.out.read_text()) if args.out.exists() else {}
    small = args.time_limit or (10.0 if args.quick else 60.0)
    big = args.chunk_time_limit or (20.0 if args.quick else 600.0)
    with Progress(console=console(stderr=True), transient=True) as progress:
        record["chunks_grid"] = chunks_grid(args.quick, small, args.workers, progress)
        write_record(args.out, IlpScaling, record)
        record["chunks_p8"] = chunks_p8(args.quick, big, args.workers, progress)
    record["chunks_load_average"] = os.getloadavg()
    write_record(args.out, IlpScaling, record)
    _show_chunks(record["chunks_grid"] + record["chunks_p8"])
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


def _show(grid_rows, scale_rows, sweep_rows, solver_rows) -> None:
    def fmt(v, spec):
        return "-" if v is None else format(v, spec)

    for title, rows in (
        ("grid (60 s limit each)", grid_rows),
        ("P=8, 1.5B, 120 s", scale_rows),
        ("memory sweep, limit in M_F, heuristic given the same limit", sweep_rows),
    ):
        print_table(
            f"ILP vs best heuristic: {title}",
            [
                "case",
                "heuristic",
                "heur span",
                "heur bubble",
                "status",
                "ilp span",
                "ilp bubble",
                "gap",
                "seconds",
                "span cut",
            ],  # fmt: skip
            [
                [
                    r["case"],
                    r["heuristic"],
                    fmt(r["heuristic_span"], ".3f"),
                    fmt(r["heuristic_bubble"], ".2%"),
                    r["status"],
                    fmt(r["ilp_span"], ".3f"),
                    fmt(r["ilp_bubble"], ".2%"),
                    fmt(r["gap"], ".2%"),
                    fmt(r["solve_seconds"], ".1f"),
                    fmt(r["span_reduction"], ".2%"),
                ]
                for r in rows
            ],  # fmt: skip
        )
    print_table(
        "same model, no warm start: CP-SAT vs big-M MILP (seconds, status)",
        ["case", "binaries", "cp-sat", "highs", "scip", "span (ms)"],
        [
            [
                r["case"],
                r["binaries"],
                f"{r['cpsat_seconds']:.1f} {r['cpsat_status']}",
                f"{r['highs_seconds']:.1f} {r['highs_status']}",
                f"{r['scip_seconds']:.1f} {r['scip_status']}",
                fmt(r["cpsat_span"], ".3f"),
            ]
            for r in solver_rows
        ],  # fmt: skip
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="a few small cases, short limits")
    parser.add_argument("--time-limit", type=float, default=None, help="grid limit (s), default 60")
    parser.add_argument("--big-time-limit", type=float, default=None, help="P=8 limit, default 120")
    parser.add_argument("--workers", type=int, default=DEFAULT_WORKERS)
    parser.add_argument("--plot", type=Path, default=None, help="folder for Gantt PNGs")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/ilp_scaling.json"))
    parser.add_argument("--show", type=Path, default=None, help="print the tables of a saved JSON")
    parser.add_argument("--chunks-only", action="store_true", help="sections 5 and 6 only")
    parser.add_argument("--chunk-time-limit", type=float, default=None,
                        help="P=8 two-chunk limit (s), default 600")  # fmt: skip
    args = parser.parse_args(argv)
    if args.chunks_only:
        return run_chunks(args)
    if args.show is not None:
        saved = json.loads(args.show.read_text())
        _show(saved["grid"], saved["scaling"], saved["memory_sweep"], saved["solvers"])
        return 0
    small = args.time_limit or (10.0 if args.quick else 60.0)
    big = args.big_time_limit or (20.0 if args.quick else 120.0)
    with Progress(console=console(stderr=True), transient=True) as progress:
        grid_rows = grid(args.quick, small, args.workers, progress)
        scale_rows = scaling(args.quick, big, args.workers, progress)
        sweep_rows = memory_sweep(args.quick, small, args.workers, progress)
        solver_rows = solvers(args.quick, 10.0 if args.quick else 30.0, args.workers, progress)
    _show(grid_rows, scale_rows, sweep_rows, solver_rows)
    if args.plot is not None:
        for path in plot_pair(args.plot, small, args.workers):
            print(f"wrote {path}", file=sys.stderr)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    record = {
        "quick": args.quick, "workers": args.workers, "time_limit_s": small,
        "big_time_limit_s": big, "load_average": os.getloadavg(),
        "grid": grid_rows, "scaling": scale_rows, "memory_sweep": sweep_rows,
        "solvers": solver_rows,
    }  # fmt: skip
    write_record(args.out, IlpScaling, record)
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
