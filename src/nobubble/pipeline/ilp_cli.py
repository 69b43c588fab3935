"""``nobubble pp solve``: the exact optimal schedule for given costs (CP-SAT).

Registered by the ``pp`` group (:mod:`nobubble.pipeline.cli`) through :func:`register`::

    nobubble pp solve --stages 4 --microbatches 8 --tf 1 --tb 1 --tw 0.5 --comm 0.05 \\
        --mem-limit 1p --time-limit 30 --plot solve.png
"""

from __future__ import annotations

import argparse
import threading
import time
from pathlib import Path

from nobubble.cliutil import (
    add_json_flag,
    nonneg_float,
    positive_float,
    positive_int,
    print_json,
    print_table,
)
from nobubble.pipeline.costs import PAPER_MODELS, CostModel

__all__ = ["register", "parse_mem_limit", "costs_from_args"]


def _per_stage(text: str) -> float | list[float]:
    """argparse type: one number, or comma-separated numbers (one per stage)."""
    try:
        values = [float(v) for v in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a number or a comma-separated list of numbers"
        ) from None
    if any(not v > 0 for v in values):
        raise argparse.ArgumentTypeError(f"{text!r}: op times must be > 0")
    return values[0] if len(values) == 1 else values


def parse_mem_limit(text: str | None, costs: CostModel) -> float | None:
    """``"12.5"`` (absolute, mem_f units), ``"1p"`` / ``"2p"`` (times p * M_F) or None."""
    if text is None:
        return None
    raw = text.strip().lower()
    try:
        if raw.endswith("p"):
            return float(raw[:-1] or 1) * costs.num_stages * max(costs.mem_f)
        value = float(raw)
    except ValueError:
        raise ValueError(
            f"--mem-limit {text!r} is neither a number nor a multiple of p*M_F like '1p' or '2p'"
        ) from None
    if value < 0:
        raise ValueError(f"--mem-limit {text} must be >= 0")
    return value


def costs_from_args(args: argparse.Namespace) -> CostModel:
    """Per-rank costs from ``--tf/--tb/--tw/--comm`` and the memory of ``--model``."""
    kw = {"t_f": args.tf, "t_b": args.tb, "t_w": args.tw, "t_comm": args.comm}
    if args.model is not None:
        hidden, heads, _layers, seq = PAPER_MODELS[args.model]
        return CostModel.paper(args.stages, hidden=hidden, heads=heads, seq=seq, **kw)
    return CostModel.from_rank_costs(args.stages, mem_f=1.0, mem_b=0.5, mem_w=0.5, **kw)


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``solve`` to the ``pp`` group's sub-parsers."""
    solve = sub.add_parser(
        "solve",
        help="exact optimal schedule (CP-SAT), warm-started by the heuristics",
        description="Find the schedule of least span (the paper's cost) or makespan for p "
        "stages and m microbatches with OR-Tools CP-SAT; report status, bound and gap.",
    )
    solve.add_argument("--stages", "-p", type=positive_int, required=True, help="p (ranks)")
    solve.add_argument("--microbatches", "-m", type=positive_int, required=True, help="m")
    solve.add_argument(
        "--tf", type=_per_stage, default=1.0, help="forward time (per stage: a,b,..)"
    )
    solve.add_argument("--tb", type=_per_stage, default=1.0, help="input-gradient backward time")
    solve.add_argument("--tw", type=_per_stage, default=1.0, help="weight-gradient backward time")
    solve.add_argument(
        "--comm", type=nonneg_float, default=0.0, help="stage-to-stage transfer time"
    )
    solve.add_argument(
        "--model", choices=sorted(PAPER_MODELS), default=None,
        help="use the paper's activation memory of this model (default: M_F = 1, split 1/2 1/2)",
    )  # fmt: skip
    solve.add_argument(
        "--mem-limit", default=None,
        help="activation limit per rank: a number (mem_f units) or '1p' / '2p' (x p*M_F)",
    )  # fmt: skip
    solve.add_argument("--objective", choices=("span", "makespan"), default="span")
    solve.add_argument("--time-limit", type=positive_float, default=60.0, help="seconds")
    solve.add_argument("--workers", type=positive_int, default=None, help="CP-SAT workers")
    solve.add_argument("--plot", type=Path, default=None, help="Gantt chart file (.png/.svg)")
    solve.add_argument("--csv", type=Path, default=None, help="write the schedule (torch CSV)")
    add_json_flag(solve)
    solve.set_defaults(func=_solve)


def _solve_with_progress(costs, args, mem_limit):
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from nobubble.cliutil import console
    from nobubble.pipeline.ilp import solve_optimal

    done = threading.Event()
    with Progress(
        TextColumn("{task.description}"), BarColumn(), TimeElapsedColumn(),
        console=console(stderr=True), transient=True,
    ) as progress:  # fmt: skip
        task = progress.add_task("solving", total=args.time_limit)

        def tick() -> None:
            t0 = time.perf_counter()
            while not done.wait(0.25):
                progress.update(task, completed=min(args.time_limit, time.perf_counter() - t0))

        def found(objective: float, bound: float, seconds: float) -> None:
            progress.update(task, description=f"best {objective:.6g}  bound {bound:.6g}")

        ticker = threading.Thread(target=tick, daemon=True)
        ticker.start()
        try:
            return solve_optimal(
                costs, num_stages=args.stages, num_microbatches=args.microbatches,
                mem_limit=mem_limit, objective=args.objective, time_limit_s=args.time_limit,
                num_workers=args.workers, on_solution=found,
            )  # fmt: skip
        finally:
            done.set()
            ticker.join(timeout=1.0)


def _solve(args: argparse.Namespace) -> int:
    costs = costs_from_args(args)
    mem_limit = parse_mem_limit(args.mem_limit, costs)
    result = _solve_with_progress(costs, args, mem_limit)
    if result.schedule is not None:
        if args.plot is not None:
            from nobubble.pipeline.plot import gantt

            gantt(result.simulation, args.plot, title=f"ILP ({result.status})")
        if args.csv is not None:
            args.csv.parent.mkdir(parents=True, exist_ok=True)
            args.csv.write_text(result.schedule.to_csv())
    if args.json:
        data = result.summary()
        data.update(stages=args.stages, microbatches=args.microbatches, mem_limit=mem_limit)
        print_json(data)
        return _exit_code(result.status)
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
    print_table(
        f"pp solve: p={args.stages}, m={args.microbatches}, {args.objective}, mem limit {limit}",
        ["schedule", "status", args.objective, "bubble", "lower bound", "gap", "seconds"],
        [[("-" if v is None else v) for v in row] for row in rows],
        caption=result.explanation,
    )
    return _exit_code(result.status)


def _exit_code(status: str) -> int:
    """0 when a schedule came back; 1 for infeasible / unknown (the reason is printed)."""
    return 0 if status in ("optimal", "feasible") else 1
