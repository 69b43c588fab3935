"""``nobubble pp solve``: the exact optimal schedule for given costs (CP-SAT).

Registered by the ``pp`` group (:mod:`nobubble.cli.pp`) through :func:`register`::

    nobubble pp solve --ranks 4 --microbatches 8 --model 1.5B --mem-limit 4 \\
        --time-limit 30 --plot solve.png
    nobubble pp solve -p 4 -m 8 --model 1.5B --chunks 2 --placement v --mem-limit 4

``--mem-limit`` is in units of M_F (4 = p*M_F for p = 4, ZB-1p's limit); none by default.
M_F is a whole rank's activations per microbatch, also with ``--chunks 2`` (each chunk
stores half of it), so the same number means the same memory for every placement.
"""

from __future__ import annotations

import argparse
import os

from nobubble.cli.pp.options import (
    add_costs,
    add_shape,
    check_size,
    costs_from_args,
    mem_limit_from_args,
)
from nobubble.cli.util import (
    UsageError,
    add_json_flag,
    output_file,
    plot_file,
    positive_float,
    positive_int,
    print_result,
)
from nobubble.files import write_text

__all__ = ["register"]


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``solve`` to the ``pp`` group's sub-parsers."""
    solve = sub.add_parser(
        "solve",
        help="exact optimal schedule (CP-SAT), warm-started by the heuristics",
        description="Find the schedule of least span (the paper's cost) or makespan for p "
        "stages and m microbatches with OR-Tools CP-SAT; report status, bound and gap.",
    )

    add_shape(solve, schedule=False, chunks=1,
              chunks_help="stages per rank (2: V or interleaved; default 1)")  # fmt: skip
    add_costs(solve, mem_limit_help="activation limit per rank in units of M_F (P = ZB-1p's); "
              "default none")  # fmt: skip
    solve.add_argument("--objective", choices=("span", "makespan"), default="span")
    solve.add_argument("--placement", choices=("v", "interleaved"), default=None,
                       help="with --chunks 2: 'v' (ZB-V's shape, default) or 'interleaved'")  # fmt: skip
    solve.add_argument("--time-limit", type=positive_float, default=60.0, help="seconds")
    solve.add_argument("--workers", type=positive_int, default=None,
                       help="CP-SAT workers (default 8)")  # fmt: skip
    solve.add_argument("--plot", type=plot_file, default=None, help="Gantt chart file (.png/.svg)")
    solve.add_argument("--csv", type=output_file, default=None,
                       help="write the schedule (torch CSV)")  # fmt: skip
    add_json_flag(solve)
    solve.set_defaults(func=_solve)


def _solve(args: argparse.Namespace) -> int:
    if args.placement is not None and args.chunks == 1:
        raise UsageError(f"--placement {args.placement} needs --chunks 2")
    check_size(args, "solve")
    cores = os.cpu_count() or 1
    if args.workers is not None and args.workers > max(8, cores) and not args.force:
        raise UsageError(f"--workers {args.workers} is past this machine's {cores} cores (and "
                         f"CP-SAT's default of 8); use at most {max(8, cores)}, or --force")  # fmt: skip
    costs = costs_from_args(args)
    mem_limit = mem_limit_from_args(args, costs, below_one=True)
    from nobubble.bench.output import progress_bar
    from nobubble.pipeline.ilp.solve import solve_optimal

    # the bar moves at each solution the solver finds (elapsed time beside)
    with progress_bar("solving", total=args.time_limit, counter=None) as (bar, task):
        result = solve_optimal(
            costs, num_stages=args.ranks, num_microbatches=args.microbatches,
            mem_limit=mem_limit, objective=args.objective, time_limit_s=args.time_limit,
            num_workers=args.workers, num_chunks=args.chunks, placement=args.placement,
            on_solution=lambda objective, bound, seconds: bar.update(
                task, completed=min(args.time_limit, seconds),
                description=f"best {objective:.6g}  bound {bound:.6g}"),
        )  # fmt: skip
    if result.schedule is not None and result.simulation is not None:  # a schedule came back
        if args.plot is not None:
            from nobubble.pipeline.plot import gantt

            gantt(result.simulation, args.plot, title=f"ILP ({result.status})")
        if args.csv is not None:
            write_text(args.csv, result.schedule.to_csv())
    rows = []
    if result.heuristic:
        rows.append([f"heuristic {result.heuristic}", "-", result.heuristic_objective,
                     result.heuristic_bubble_rate, "-", "-", "-"])  # fmt: skip
    rows.append([
        "ilp (cp-sat)", result.status, result.objective, result.bubble_rate,
        result.lower_bound, "-" if result.gap is None else f"{result.gap:.2%}",
        f"{result.solve_seconds:.1f}",
    ])  # fmt: skip
    limit = "none" if mem_limit is None else f"{mem_limit:g}"
    shape = "" if args.chunks == 1 else f", {args.chunks} chunks ({result.placement})"
    print_result(
        args.json,
        result.summary()
        | {"stages": args.ranks, "microbatches": args.microbatches, "mem_limit": mem_limit},
        f"pp solve: p={args.ranks}, m={args.microbatches}{shape}, {args.objective}, "
        f"mem limit {limit}",
        ["schedule", "status", args.objective, "bubble", "lower bound", "gap", "seconds"],
        [[("-" if v is None else v) for v in row] for row in rows],
        caption=result.explanation,
    )
    return _exit_code(result.status)


def _exit_code(status: str) -> int:
    """0 when a schedule came back; 1 for infeasible / unknown (the reason is printed)."""
    return 0 if status in ("optimal", "feasible") else 1
