"""``nobubble pp``: show, simulate, compare, export, validate and solve pipeline schedules, and
their memory/bubble frontier, from the shared size, schedule, cost and dispatch flags below;
``pp profile | plan | run`` are :mod:`.run`'s."""

from __future__ import annotations

import argparse

from nobubble.bench import pp_tables
from nobubble.bench.output import console, print_json, print_result
from nobubble.cli.flags import add_args
from nobubble.cli.pp import run as pp_run
from nobubble.cli.pp.options import (
    CHUNKS,
    COSTS,
    DISPATCH,
    MEM_LIMIT,
    SHAPE,
    SIZE,
    TIME_FLAGS,
    file_sets_size,
    mem_limit,
    perturbation_from_args,
    rank_costs,
    read_file,
    refuse,
    setting,
)
from nobubble.cli.util import (
    ArgumentParser,
    add_json_flag,
    input_file,
    output_file,
    plot_file,
    positive_float,
    positive_int,
)
from nobubble.files import write_text

# -- pp show (SHOW_SHAPE: its shape flags and their defaults, applied without --csv) ------
SHOW_SHAPE = {"schedule": ("-s", "zb-h1"), "ranks": ("-p", 4), "microbatches": ("-m", 8),
              "chunks": ("-v", None)}  # fmt: skip


def _show(args: argparse.Namespace) -> int:
    from nobubble.pipeline.plot import ascii_grid
    from nobubble.pipeline.validate import validate

    given = [flag for dest, (flag, _) in SHOW_SHAPE.items() if getattr(args, dest) is not None]
    refuse((args.csv is not None and (given or args.force), f"--csv {args.csv} sets the schedule "
            f"and its shape; drop {', '.join(given + ['--force'] * args.force)}"))  # fmt: skip
    if args.csv is not None:
        sched = read_file(args.csv, "")
        validate(sched)  # before a grid is drawn: a broken file is one line, exit 2
    else:
        vars(args).update({d: v for d, (_, v) in SHOW_SHAPE.items() if getattr(args, d) is None})
        sched = setting(args).build(unit=True)
    if args.json:
        print_json(sched.as_dict())
        return 0
    console().print(f"{sched.name}: P={sched.num_ranks}, M={sched.num_microbatches}, "
                    f"{sched.num_chunks} chunk(s)/rank, unit costs F=B=W=1 (BW=2), _ = idle")  # fmt: skip
    console().print(ascii_grid(sched, microbatches=args.ids), markup=False)
    return 0


# -- pp simulate ---------------------------------------------------------------------------
def _simulate(args: argparse.Namespace) -> int:
    from nobubble.pipeline.plot import gantt, write_trace

    costs, result, run = setting(args).simulate(args.dispatch, perturbation_from_args(args))
    pictures = ((gantt, args.plot), (write_trace, args.trace))
    files = [str(write(result, path)) for write, path in pictures if path is not None]
    summary = run.summary() if run is not None else result.summary()
    data = summary | {"spans": list(result.spans), "busy": list(result.busy), "files": files}
    table = pp_tables.simulate_table(result, run, costs.mem_f[0])
    print_result(args.json, data, **table, files=files)
    return 0


# -- pp export / validate ------------------------------------------------------------------
def _export(args: argparse.Namespace) -> int:
    text = (sched := setting(args).build()).to_csv()
    if args.output is None and not args.json:
        print(text, end="")
        return 0
    if args.output is not None:
        write_text(args.output, text)
    info = {"schedule": sched.name, **sched.shape,
            "output": str(args.output) if args.output else None}  # fmt: skip
    print_result(args.json, info | ({} if args.output else {"csv": text}),
                 f"exported {sched.name}", list(info), [list(info.values())])  # fmt: skip
    return 0


def _validate(args: argparse.Namespace) -> int:
    from nobubble.pipeline.simulate import simulate
    from nobubble.pipeline.validate import validate

    sched = read_file(args.file, "")
    validate(sched)  # ScheduleError is a ValueError: one line, exit 2
    args.ranks = sched.num_ranks
    result = simulate(sched, setting(args).cost_model(), check=False)
    info = {"file": str(args.file), "valid": True, **sched.shape,
            "split_backward": sched.uses_split_backward, "bubble_rate": result.bubble_rate,
            "max_peak_memory_vs_1f1b": result.max_peak_memory_vs_1f1b}  # fmt: skip
    print_result(args.json, info, f"{args.file}: valid", list(info)[1:], [list(info.values())[1:]])
    return 0


def _compare(args: argparse.Namespace) -> int:
    from nobubble.bench.output import progress_bar
    from nobubble.pipeline.compare import cost_summary

    (s := setting(args)).check_size("compare")
    costs = s.cost_model()
    with progress_bar("simulating", total=None, counter=None) as (bar, task):
        rows = s.compare(costs, include_torch=not args.no_torch, ilp_time_limit_s=args.ilp,
                         on_step=lambda n: bar.update(task, description=f"simulating {n}"))  # fmt: skip
    files = []
    if args.plot is not None:
        from nobubble.pipeline.plot import gantt_grid

        files.append(str(gantt_grid([r.result for r in rows if r.result], args.plot)))
    c = cost_summary(costs)
    data = {"stages": args.ranks, "microbatches": args.microbatches, "costs": c,
            "rows": [r.as_dict() for r in rows], "files": files}  # fmt: skip
    table = pp_tables.compare_table(rows, c, args.ranks, args.microbatches)
    print_result(args.json, data, **table, files=files)
    if (claim := pp_tables.zb2p_claim(rows)) is not None and not args.json:
        console().print(claim)
    return 0


# -- pp solve / frontier -------------------------------------------------------------------
def _solve(args: argparse.Namespace) -> int:
    from nobubble.bench.output import progress_bar

    s = setting(args)
    s.check_solve(args.placement, args.workers)  # before the bar and the solver's import
    # the bar moves at each solution the solver finds (elapsed time beside)
    with progress_bar("solving", total=args.time_limit, counter=None) as (bar, task):
        result = s.solve(
            objective=args.objective, time_limit_s=args.time_limit, num_workers=args.workers,
            placement=args.placement,
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
    data = {"stages": args.ranks, "microbatches": args.microbatches}
    table = pp_tables.solve_table(result, args.ranks, args.microbatches)
    print_result(args.json, result.summary() | data, **table)
    return 0 if result.status in ("optimal", "feasible") else 1  # 1: infeasible / unknown


def _frontier(args: argparse.Namespace) -> int:
    from nobubble.pipeline.frontier import check_frontier, default_sources, frontier

    check_frontier(setting(args), args.mem_limits)
    sources = default_sources(args.ranks, mem_limits=args.mem_limits,
                              include_torch=not args.no_torch, ilp_time_limit_s=args.ilp)  # fmt: skip
    result = frontier(_costs(args), num_ranks=args.ranks, num_microbatches=args.microbatches,
                      sources=sources)  # fmt: skip
    files = []
    if args.plot is not None:
        from nobubble.pipeline.plot import frontier_plot

        title = (f"P={args.ranks}, M={args.microbatches}"
                 + (f", {args.model}" if args.model else ""))  # fmt: skip
        files.append(str(frontier_plot(result.points, args.plot, title=title)))
    data = {"stages": args.ranks, "microbatches": args.microbatches,
            "memory_unit": "microbatches of one rank's activations",
            "points": [q.as_dict() for q in result.points],
            "pareto": [q.name for q in result.pareto], "seconds": result.seconds,
            "files": files}  # fmt: skip
    print_result(args.json, data, **pp_tables.frontier_table(result), files=files)
    return 0


def _costs(args: argparse.Namespace):
    if args.costs is None:
        return setting(args).cost_model()
    given = [flag for flag, dest in TIME_FLAGS if getattr(args, dest) is not None]
    refuse((given, f"--costs replaces {''.join(given[:1])}; give one of them"))
    costs = read_file(args.costs, "--costs", "profile").cost_model()
    file_sets_size(args, f"--costs {args.costs}", costs.num_stages)
    return costs


ILP = {"nargs": "?", "const": 30.0, "metavar": "SECONDS"}
"""``--ilp``'s own keywords: given bare, the solver runs 30 s."""


COMMANDS: tuple[tuple, ...] = (  # (name, help, flag tables, own flags (add_args rows), run, defaults)
    ("show", "print a schedule as a text grid (time slots per rank)", SHAPE, (
        ("--ids", bool, False, "show microbatch numbers in the cells"),
        ("--csv", input_file, None, "show this torch CSV instead (it sets the schedule and its shape)"),
    ), _show, dict.fromkeys(SHOW_SHAPE)),  # None: not given, so that --csv can refuse a shape
    ("simulate", "simulate one schedule: bubble, spans, peak memory",
     (*SHAPE, *COSTS, MEM_LIMIT, DISPATCH), (
        ("--plot", plot_file, None, "write a Gantt chart (.png or .svg)"),
        ("--trace", output_file, None, "write a Chrome trace (.json) for Perfetto"),
    ), _simulate, {}),
    ("compare", "every schedule on the same costs: bubble, memory, throughput",
     (SIZE, CHUNKS, *COSTS, MEM_LIMIT), (
        ("--no-torch", bool, False, "leave out torch's own schedules"),
        ("--ilp", positive_float, None, "add the exact ILP row (time limit, default 30 s)", ILP),
        ("--plot", plot_file, None, "write every schedule's Gantt chart in one image"),
    ), _compare, {}),
    ("export", "write a schedule as torch's compute-only CSV", (*SHAPE, *COSTS, MEM_LIMIT), (
        ("-o --output", output_file, None, "CSV file (default: stdout)"),
    ), _export, {}),
    ("validate", "check a torch-format CSV schedule and simulate it", COSTS, (
        ("file", input_file, None, "CSV: one row per rank, cells like 0F0, 0I0, 0W0, 0B0"),
    ), _validate, {"chunks": None, "microbatches": None, "force": False}),  # the file's order
    ("solve", "exact optimal schedule (CP-SAT), warm-started by the heuristics",
     (SIZE, *COSTS, mem_limit("activation limit per rank in units of M_F (P = ZB-1p's); "
                              "default none")), (
        ("--chunks -v", positive_int, 1, "stages per rank (2: V or interleaved; default 1)"),
        ("--objective", ("span", "makespan"), "span", None),
        ("--placement", ("v", "interleaved"), None,
         "with --chunks 2: 'v' (ZB-V's shape, default) or 'interleaved'"),
        ("--time-limit", positive_float, 60.0, "seconds"),
        ("--workers", positive_int, None, "CP-SAT workers (default 8)"),
        ("--plot", plot_file, None, "Gantt chart file (.png/.svg)"),
        ("--csv", output_file, None, "write the schedule (torch CSV)"),
    ), _solve, {}),
    # --mem-limit stays, hidden, so that it is refused rather than taken for --mem-limits
    ("frontier", "every schedule as (peak memory, bubble); the Pareto-optimal ones",
     (SIZE, *COSTS, mem_limit(argparse.SUPPRESS)), (
        ("--costs", input_file, None, "per-rank costs from a pp profile JSON (instead of "
         "--model/--tf/...)", {"metavar": "FILE"}),
        ("--mem-limits", rank_costs, None, "memory limits for the ZB heuristic and solver sweeps, "
         "rank units (default about p/3 ... 2p)", {"metavar": "L1,L2,..."}),
        ("--ilp", positive_float, None, "add the exact solver's points (time limit of each "
         "solve, default 30 s)", ILP),
        ("--no-torch", bool, False, "leave out torch's own schedules"),
        ("--plot", plot_file, None, "write the picture (.png/.svg/.pdf)"),
    ), _frontier, {"ranks": 8, "microbatches": 24}),
)  # fmt: skip


def register(parser: argparse.ArgumentParser) -> None:
    parser.set_defaults(group_parser=parser)
    sub = parser.add_subparsers(
        dest="pp_command", metavar="SUBCOMMAND", parser_class=ArgumentParser
    )
    for name, help_text, tables, rows, func, defaults in (*COMMANDS, *pp_run.COMMANDS):
        p = sub.add_parser(name, help=help_text)
        for table in tables:  # (title, add_args rows), or a function that adds its own
            if callable(table):
                table(p)
            else:
                add_args(p.add_argument_group(table[0]) if table[0] else p, table[1])
        add_args(p, rows)
        add_json_flag(p)
        p.set_defaults(func=func, **defaults)
