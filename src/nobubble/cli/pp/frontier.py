"""``nobubble pp frontier``: every schedule as (peak activation memory, bubble), Pareto set.

    nobubble pp frontier -p 8 -m 24 --model 1.5B --plot frontier.png
    nobubble pp frontier -p 4 -m 8 --ilp 10 --mem-limits 2,3,4 --json

Points: our generators (the V schedules of controllable memory included), ZB's automatic
scheduler and, with ``--ilp`` > 0, the exact single-chunk solver at each of
``--mem-limits`` (rank units: one microbatch's activations on a rank), and torch's own
schedules. ``--costs FILE`` takes a ``pp profile -o`` JSON instead of ``--model``/``--tf``...
"""

from __future__ import annotations

import argparse
import time

from nobubble.cli.pp.options import (
    add_costs,
    add_size,
    check_size,
    costs_from_args,
    read_profile_json,
)
from nobubble.cli.util import (
    UsageError,
    add_json_flag,
    input_file,
    plot_file,
    positive_float,
    print_result,
)

__all__ = ["register"]


def register(sub) -> None:
    p = sub.add_parser("frontier", help="every schedule as (peak memory, bubble); the "
                       "Pareto-optimal ones")  # fmt: skip
    add_size(p, ranks=8, microbatches=24)
    # --mem-limit stays, hidden, so that it is refused rather than taken for --mem-limits
    add_costs(p, mem_limit_help=argparse.SUPPRESS)
    p.add_argument("--costs", type=input_file, default=None, metavar="FILE",
                   help="per-rank costs from a pp profile JSON (instead of --model/--tf/...)")  # fmt: skip
    p.add_argument("--mem-limits", type=_limits, default=None, metavar="L1,L2,...",
                   help="memory limits for the ZB heuristic and solver sweeps, rank units "
                        "(default about p/3 ... 2p)")  # fmt: skip
    p.add_argument("--ilp", type=positive_float, nargs="?", const=30.0, default=None,
                   metavar="SECONDS", help="add the exact solver's points (time limit of each "
                   "solve, default 30 s)")  # fmt: skip
    p.add_argument("--no-torch", action="store_true", help="leave out torch's own schedules")
    p.add_argument("--plot", dest="plot", type=plot_file, default=None,
                   help="write the picture (.png/.svg/.pdf)")  # fmt: skip
    add_json_flag(p)
    p.set_defaults(func=_frontier)


def _limits(text: str) -> tuple[float, ...]:
    """argparse type: comma-separated positive numbers."""
    return tuple(sorted({positive_float(part) for part in text.split(",")}))


def _frontier(args: argparse.Namespace) -> int:
    from nobubble.pipeline import frontier as fr

    _check_args(args)
    costs = _costs(args)
    sources = fr.default_sources(args.ranks, mem_limits=args.mem_limits,
                                 include_torch=not args.no_torch, ilp_time_limit_s=args.ilp)  # fmt: skip
    started = time.perf_counter()
    result = fr.frontier(costs, num_ranks=args.ranks, num_microbatches=args.microbatches,
                         sources=sources)  # fmt: skip
    seconds = time.perf_counter() - started
    files = []
    if args.plot is not None:
        from nobubble.pipeline.plot import frontier_plot

        title = (f"P={args.ranks}, M={args.microbatches}"
                 + (f", {args.model}" if args.model else ""))  # fmt: skip
        files.append(str(frontier_plot(result.points, args.plot, title=title)))
    rows = sorted(result.points, key=lambda q: (not q.ok, q.peak_memory, q.bubble_rate))
    print_result(
        args.json,
        {"stages": args.ranks, "microbatches": args.microbatches,
         "memory_unit": "microbatches of one rank's activations",
         "points": [q.as_dict() for q in result.points],
         "pareto": [q.name for q in result.pareto], "seconds": seconds, "files": files},
        f"P={args.ranks}, M={args.microbatches}: bubble vs peak activation memory",
        ["schedule", "from", "peak mem", "bubble", "pareto", "note"],
        [
            [
                q.name,
                q.source,
                f"{q.peak_memory:.2f}" if q.ok else "-",
                f"{q.bubble_rate:.2%}" if q.ok else "-",
                "*" if q.pareto else "",
                q.note,
            ]
            for q in rows
        ],
        caption="peak memory in microbatches of one rank's activations (1F1B: P); "
        f"* = Pareto-optimal; {seconds:.1f} s",
        files=files,
    )  # fmt: skip
    return 0


def _check_args(args: argparse.Namespace) -> None:
    """Refuse, before any work, what the frontier cannot do or cannot do in time."""
    from nobubble.pipeline.schedules.budget import check_ops

    if args.mem_limit is not None:
        raise UsageError("pp frontier sweeps --mem-limits (plural), not --mem-limit")
    if args.ranks < 2:
        raise UsageError(f"--ranks {args.ranks}: a frontier needs at least 2 ranks")
    check_size(args, "compare", v_memory=True)  # every schedule, V-Min/V-Half/V-ZB too
    try:  # the exact solver's budget: one stage per rank
        if args.ilp is not None:
            check_ops(args.ranks, args.microbatches, num_chunks=1, budget="solve")
    except ValueError as err:
        raise UsageError(f"--ilp: {err}, or drop --ilp") from None
    if args.mem_limits and min(args.mem_limits) < 1:
        raise UsageError(f"--mem-limits {min(args.mem_limits):g} is below one microbatch's "
                         "activations (the unit); give limits >= 1")  # fmt: skip


def _costs(args: argparse.Namespace):
    if args.costs is None:
        return costs_from_args(args)
    given = [f for f in ("model", "tf", "tb", "tw", "tcomm") if getattr(args, f) is not None]
    if given:
        raise UsageError(f"--costs replaces --{given[0]}; give one of them")
    prof = read_profile_json(args.costs, "--costs")
    costs = prof.cost_model()
    if costs.num_stages != args.ranks:
        raise UsageError(f"--costs {args.costs} has {costs.num_stages} ranks but --ranks is "
                         f"{args.ranks}; pass --ranks {costs.num_stages}")  # fmt: skip
    return costs
