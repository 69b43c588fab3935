"""``nobubble pp profile | plan | run``: measure a built-in model's costs, pick a schedule (or,
``--model MODULE:FACTORY``, a whole plan for a model of the user's own) and train with it on
local ranks; under ``torchrun`` (RANK/WORLD_SIZE set) ``pp run`` runs as one rank of the job
and writes its own trace file. The usage is docs/pipeline/runtime.md's and plan.md's."""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import statistics
from pathlib import Path
from typing import TYPE_CHECKING

from nobubble.bench import pp_tables
from nobubble.bench.output import console, print_json, print_result
from nobubble.budget import check_budget
from nobubble.cli.flags import add_args
from nobubble.cli.pp.options import (
    DISPATCH_CHOICES,
    SIZE,
    STRAGGLER,
    add_model_and_launch,
    check_estimated_time,
    check_factory_flags,
    check_launch,
    file_sets_size,
    given_model_flags,
    load_user_model,
    model_from_args,
    read_file,
    refuse,
    setting,
    straggler_arg,
)
from nobubble.cli.util import (
    UsageError,
    input_file,
    nonneg_float,
    output_file,
    plot_file,
    positive_float,
    positive_int,
)
from nobubble.files import claim_output, write_text
from nobubble.pipeline.plan_inputs import MiB, absolute_spec, is_user_model

if TYPE_CHECKING:
    from nobubble.distributed.options import LaunchOptions
    from nobubble.pipeline.plan import Plan

TOP_CANDIDATES = 8  # rows of the plan table: the chosen plan, then the next fastest
DEFAULT_MICROBATCHES = 8  # -m of the built-in models' pp plan and pp run


def _profile(args: argparse.Namespace) -> int:
    from nobubble.distributed import check_device

    refuse((is_user_model(args.model), "pp profile takes the built-in models (--model gpt|mlp); "
            "a model of your own is profiled block by block by pp plan --model MODULE:FACTORY"))  # fmt: skip
    model = model_from_args(args)
    launch = check_launch(args, None, model)
    claim = claim_output(args.output) if args.output is not None else contextlib.nullcontext()
    with claim:  # before torch: refuse another live run's output
        check_device(launch.device, launch.backend)
        from nobubble.pipeline.runtime.profile import profile_stages

        with console(stderr=True).status(f"profiling {args.num_stages} stages of {model.name}"):
            prof = profile_stages(
                model, args.num_stages, microbatch_size=args.microbatch_size, clock=args.clock,
                device=launch.device, backend=launch.backend, repeats=args.repeats,
                threads=launch.threads_per_rank, comm=not args.no_comm, timeout_s=launch.timeout_s,
            )  # fmt: skip
        if args.output is not None:
            prof.write(args.output)
    files = [str(args.output)] if args.output is not None else []
    print_result(args.json, prof.to_dict(), **pp_tables.profile_table(prof), files=files)
    return 0


def _plan(args: argparse.Namespace) -> int:
    from nobubble.distributed import check_device

    if user := is_user_model(args.model):
        check_factory_flags(args)
    refuse(
        (user and args.profile is not None, "--profile applies to the built-in models (--model "
         "gpt|mlp); a model of your own is profiled block by block here"),
        *((given is not None and not user, f"{flag} applies to --model MODULE:FACTORY; a "
           "built-in model's plan is drawn by pp simulate --plot and measures its own costs")
          for flag, given in (("--plot", args.plot), ("--overhead-ms", args.overhead_ms))),
        (args.profile is not None and given_model_flags(args), f"--profile {args.profile} sets "
         f"the model; drop {', '.join(given_model_flags(args))} (or profile that model with pp "
         "profile -o)"),
    )  # fmt: skip
    if not user:
        args.microbatches = args.microbatches or DEFAULT_MICROBATCHES
        # every schedule is generated and simulated, as pp compare
        setting(args).check_size("compare")
    model = model_from_args(args) if not user and args.profile is None else None
    launch = check_launch(args, args.ranks, model)
    prof = read_file(args.profile, "--profile", "profile") if args.profile is not None else None
    out = args.output or Path("plan.json" if user else "plan.csv")
    with claim_output(out):  # before torch: refuse another live run's output
        check_device(launch.device, launch.backend, ranks=args.ranks)
        from nobubble.pipeline.runtime.planning import make_plan

        with console(stderr=True).status("planning") as status:
            p = make_plan(
                num_ranks=args.ranks, num_microbatches=args.microbatches, launch=launch,
                profile=prof, model=model, microbatch_size=args.microbatch_size,
                user=load_user_model(args.model, seed=args.seed) if user else None,
                recompute=args.recompute, ilp_time_limit_s=args.ilp, clock=args.clock,
                memory_limit=args.memory_limit_mib * MiB if args.memory_limit_mib else None,
                overhead_ms=args.overhead_ms, progress=status.update,
            )  # fmt: skip
        if user:
            return _user_plan(args, p, launch, out)
        write_text(out, p.schedule().to_csv())
    rows = [p.describe(c) for c in p.candidates]
    if args.json:
        print_json({"best": p.schedule_name, "recompute": p.recompute[0], "output": str(out),
                    "schedules": rows})  # fmt: skip
        return 0
    source = model.name if model is not None else getattr(prof, "model", "")
    pp_tables.print_plan(p, rows, source, out, limited=args.memory_limit_mib is not None)
    return 0


def _run(args: argparse.Namespace) -> int:
    if args.plan is not None:
        check_factory_flags(args)
        return run_user_plan(args, check_launch(args, args.ranks, None))
    refuse(
        (is_user_model(args.model), "--model MODULE:FACTORY runs a plan: give --plan plan.json "
         "(write one with pp plan --model MODULE:FACTORY --out plan.json)"),
        (args.ranks is None, "--ranks is required with --schedule or --schedule-file"),
    )  # fmt: skip
    if args.schedule is not None:  # unit costs until profiled (a cost-dependent one is rebuilt)
        args.microbatches = args.microbatches or DEFAULT_MICROBATCHES
        sched = setting(args).build(unit=True)
    else:  # the file sets --microbatches
        sched = read_file(args.schedule_file, "--schedule-file")
        source = f"--schedule-file {args.schedule_file}"
        file_sets_size(args, source, sched.num_ranks, sched.num_microbatches)
    model = model_from_args(args)
    launch = check_launch(args, args.ranks, model)  # sizes, steps: with M known
    torchrun = "RANK" in os.environ and "WORLD_SIZE" in os.environ
    # before torch: refuse another live run's output (under torchrun each rank claims its own)
    with contextlib.nullcontext() if torchrun else claim_output(args.trace):
        from nobubble.distributed import check_device
        from nobubble.pipeline.runtime.executor import TrainConfig, check_config
        from nobubble.pipeline.runtime.launch import run_profiled, run_torchrun_traced

        check_device(launch.device, launch.backend, ranks=args.ranks)
        config = TrainConfig(
            model=model, schedule=sched, microbatch_size=args.microbatch_size,
            num_steps=args.steps, optimizer=args.optimizer, lr=args.lr, data_seed=args.seed,
            recompute=args.recompute, dispatch=args.dispatch, straggler=args.straggler,
        )  # fmt: skip
        check_config(config)  # before profiling or starting anything
        if torchrun:
            return _print_rank(args.json, *run_torchrun_traced(config, launch, args.trace))
        # the ranks run from the main thread, so Ctrl-C and SIGTERM reach spawn's clean-up
        with console(stderr=True).status("profiling") as status:
            summary, files = run_profiled(
                config, launch, trace=args.trace, predict=not args.no_predict, clock=args.clock,
                setting=setting(args) if args.schedule is not None else None, plot=args.plot,
                progress=status.update,
            )  # fmt: skip
    print_result(args.json, {**summary.to_dict(), **files}, **pp_tables.run_table(summary, files))
    return 0


def _print_rank(as_json: bool, res, path: Path) -> int:
    if res.losses is not None:  # the rank of the last stage speaks for the run
        med = statistics.median(res.step_times_s)
        if as_json:
            print_json({"rank": res.rank, "median_step_time_s": med, "losses": list(res.losses),
                        "trace": str(path)})  # fmt: skip
        else:
            console().print(
                f"rank {res.rank} (last stage): median step {med * 1e3:.1f} ms, loss "
                f"{res.losses[0]:.4f} -> {res.losses[-1]:.4f}; trace {path} (one per rank)"
            )
    return 0


# -- pp plan --model MODULE:FACTORY --------------------------------------------------------
def _user_plan(args: argparse.Namespace, p: Plan, launch: LaunchOptions, out: Path) -> int:
    """``pp plan --model MODULE:FACTORY``'s output: the plan's JSON at ``out``, its Gantt chart
    above the naive plan's, the table of the chosen plan, the next candidates and the naive."""
    naive_plan = p.naive()
    plot = p.draw(args.plot if args.plot is not None else out.with_suffix(".png"), naive_plan)
    shown = [p.chosen, *[c for c in p.candidates if c != p.chosen][: TOP_CANDIDATES - 1]]
    rows, naive = [p.describe(c) for c in shown], p.describe(naive_plan)
    write_text(out, p.to_json())
    if args.json:
        print_json({"output": str(out), "plot": str(plot), "chosen": rows[0], "candidates": rows,
                    "naive_1f1b": naive})  # fmt: skip
        return 0
    limited = args.memory_limit_mib is not None
    pp_tables.print_user_plan(
        p, args.model, rows, naive, out, plot, threads=launch.threads_per_rank, limited=limited
    )
    return 0


# -- pp run --plan plan.json --model MODULE:FACTORY ----------------------------------------
def run_user_plan(args: argparse.Namespace, launch: LaunchOptions) -> int:
    """``pp run --plan``: the plan on local ranks, each building the model from the factory."""
    from nobubble.distributed import check_device
    from nobubble.pipeline.runtime.planning.train import train_plan

    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        raise UsageError("pp run --plan starts its own local ranks; run it without torchrun")
    p = read_file(args.plan, "--plan", "plan")
    given = [flag for flag, on in (("--recompute", args.recompute), ("--plot", args.plot),
                                   ("--straggler", args.straggler)) if on]  # fmt: skip
    refuse(
        (not is_user_model(args.model), "--plan runs a plan of your own model: give the factory "
         "it was made from, --model MODULE:FACTORY"),
        (given, f"{', '.join(given)}: not with --plan (the plan sets recompute; plotting and "
         "stragglers are for the built-in models)"),
    )  # fmt: skip
    file_sets_size(args, f"--plan {args.plan}", p.num_ranks, p.num_microbatches, "is a plan for")
    check_budget("pp run", processes=p.num_ranks, force=args.force)
    spec = absolute_spec(args.model)
    model = load_user_model(spec, seed=args.seed)  # checked here, before any rank starts
    model.check_plan(p)  # another block count, or a batch the plan's microbatches do not split
    batch = int(model.inputs.shape[0])
    if p.setting.batch_size not in (None, batch):
        console(stderr=True).print(f"note: {args.plan} was planned for a batch of "
                                   f"{p.setting.batch_size} rows, this one has {batch}; the "
                                   "prediction is for the planned batch")  # fmt: skip
    tokens = model.batch_tokens // p.num_microbatches
    check_estimated_time(args, p.num_ranks, model.num_parameters, tokens)
    check_device(launch.device, launch.backend, ranks=p.num_ranks)
    with console(stderr=True).status(f"running {p.schedule_name} on {p.num_ranks} ranks"):
        run = train_plan(p, functools.partial(load_user_model, spec, seed=args.seed),
                         steps=args.steps, optimizer=args.optimizer, lr=args.lr,
                         dispatch=args.dispatch, launch=launch)  # fmt: skip
    data = {
        "schedule": p.schedule_name,
        "num_ranks": p.num_ranks,
        "stage_sizes": list(p.stage_sizes()),
        "num_microbatches": p.num_microbatches,
        "recompute": p.recompute[0],
        "losses": list(run.losses),
        "step_ms": list(run.step_ms),
        "median_step_ms": run.median_step_ms,
        "predicted_step_ms": p.predicted_step_ms,
    }
    print_result(args.json, data, **pp_tables.plan_run_table(p, args.plan, run))
    return 0


def add_source(p: argparse.ArgumentParser) -> None:
    """``pp run``'s schedule: exactly one of ``--schedule``, ``--schedule-file``, ``--plan``."""
    add_args(p.add_mutually_exclusive_group(required=True), (
        ("--schedule -s", str, None, "schedule name (gpipe, 1f1b, zb-h1, ...)"),
        ("--schedule-file", input_file, None, "torch compute-only CSV"),
        ("--plan", input_file, None, "plan JSON of pp plan --model MODULE:FACTORY (with that --model)"),
    ))  # fmt: skip


COMMANDS: tuple[tuple, ...] = (  # as nobubble.cli.pp.COMMANDS
    ("profile", "measure per-stage T_F, T_B, T_W, T_comm and memory", (add_model_and_launch,), (
        ("--stages", positive_int, 2, "stages (ranks, or ranks x chunks)", {"dest": "num_stages"}),
        ("--repeats", positive_int, 5, "timed repeats per op"),
        ("--no-comm", bool, False, "skip the 2-process T_comm probe"),
        ("-o --output", output_file, None, "write the profile JSON"),
        ("--force", bool, False, "run sizes past the memory and time budgets"),
    ), _profile, {}),
    ("plan", "choose a schedule (built-in model) or a whole plan (--model MODULE:FACTORY: cut, "
     "schedule, microbatches, recompute)", (SIZE, add_model_and_launch), (
        ("--profile", input_file, None, "profile JSON (pp profile -o); it sets the model"),
        ("--ilp", positive_float, None, "also run the exact solver", {"metavar": "SECONDS"}),
        ("-o --output --out", output_file, None, "the best schedule's CSV (default plan.csv); "
         "--model MODULE:FACTORY: the plan's JSON (default plan.json)"),
        ("--plot", plot_file, None, "--model MODULE:FACTORY: the plan's Gantt chart above the "
         "naive 1F1B's (default: --out as .png)"),
        ("--recompute", bool, False, "also weigh every schedule with activation checkpointing"),
        ("--memory-limit-mib", positive_float, None, "peak activations per rank",
         {"metavar": "MIB"}),
        ("--overhead-ms", nonneg_float, None, "--model MODULE:FACTORY: the runtime's cost per "
         "action (default measured, with the cost per byte; 0: compute only)", {"metavar": "MS"}),
    ), _plan, {"ranks": 2, "microbatches": None}),
    ("run", "train a model with a schedule or a plan on local ranks",
     (add_source, SIZE, add_model_and_launch), (
        ("--steps", positive_int, 3, "training steps"),
        ("--optimizer", ("sgd", "adamw"), "sgd", None),
        ("--lr", positive_float, 0.01, None),
        ("--no-predict", bool, False, "skip profiling + simulation"),
        ("--recompute", bool, False, "activation checkpointing: F keeps its input, B runs F again"),
        ("--trace", output_file, Path("nobubble-out/pp_run_trace.json"), "merged Chrome trace"),
        ("--plot", plot_file, None, "PNG/SVG: the last measured step above the simulated one"),
        ("--dispatch", DISPATCH_CHOICES, "static", "walk the schedule, or pick ops as they arrive"),
        ("--straggler", straggler_arg, None, "really slow RANK by FACTOR", {"metavar": STRAGGLER}),
    ), _run, {"ranks": None, "microbatches": None}),
)  # fmt: skip
