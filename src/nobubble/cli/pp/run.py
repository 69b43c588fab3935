"""``nobubble pp profile | plan | run``: measure costs, pick a schedule, train with it.

Registered by the ``pp`` group (:mod:`nobubble.cli.pp`) through :func:`register`::

    nobubble pp profile --stages 2 --layers 4 --hidden 256 --seq-len 128 -o profile.json
    nobubble pp plan --profile profile.json --microbatches 8 -o plan.csv
    nobubble pp run --schedule zb-h1 --ranks 2 --microbatches 8 --steps 5
    nobubble pp run --schedule-file plan.csv --ranks 2 --steps 5 --trace run.json
    nobubble pp plan --model my_model.py:factory --ranks 2 --out plan.json
    nobubble pp run --plan plan.json --model my_model.py:factory --steps 5

The built-in models are ``--model gpt|mlp`` (or ``--arch``); ``--model MODULE:FACTORY``
plans and runs a model of the user's own (:mod:`nobubble.cli.pp.plan`).

Under ``torchrun`` (RANK/WORLD_SIZE set) ``pp run`` runs as one rank of the job and writes
its own trace file (merge them with ``nobubble trace merge``).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from nobubble.cli.pp.options import (
    DISPATCH_CHOICES,
    add_launch,
    add_model,
    add_size,
    check_factory_flags,
    check_launch,
    check_size,
    given_model_flags,
    is_user_model,
    model_from_args,
    read_profile_json,
    read_schedule_csv,
    schedule_from_args,
    straggler_arg,
)
from nobubble.cli.pp.plan import MiB, describe, plan_user_model, print_candidates, run_user_plan
from nobubble.cli.util import (
    UsageError,
    add_json_flag,
    console,
    input_file,
    nonneg_float,
    output_file,
    plot_file,
    positive_float,
    positive_int,
    print_json,
    print_result,
    print_table,
)
from nobubble.files import claim_output, write_text

if TYPE_CHECKING:
    from nobubble.distributed.options import LaunchOptions
    from nobubble.pipeline.actions import Schedule
    from nobubble.pipeline.plan import Plan
    from nobubble.pipeline.runtime.models import ModelConfig
    from nobubble.pipeline.runtime.profile_data import Profile

__all__ = ["register"]

DEFAULT_MICROBATCHES = 8
"""``-m`` of the built-in models' ``pp plan`` and ``pp run`` (a user model's plan chooses)."""


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``profile``, ``plan`` and ``run`` to the ``pp`` group's sub-parsers."""
    prof = sub.add_parser("profile", help="measure per-stage T_F, T_B, T_W, T_comm and memory")
    prof.add_argument(
        "--stages",
        dest="num_stages",
        type=positive_int,
        default=2,
        help="model stages to split into (one per rank, or ranks x chunks)",
    )
    prof.add_argument("--repeats", type=positive_int, default=5, help="timed repeats per op")
    prof.add_argument("--no-comm", action="store_true", help="skip the 2-process T_comm probe")
    prof.add_argument(
        "-o", "--output", type=output_file, default=None, help="write the profile JSON"
    )
    prof.add_argument("--force", action="store_true",
                      help="run sizes past the memory and time budgets")  # fmt: skip
    add_model(prof)
    add_launch(prof)
    add_json_flag(prof)
    prof.set_defaults(func=_profile)

    plan = sub.add_parser("plan", help="choose a schedule (built-in model) or a whole plan "
                          "(--model MODULE:FACTORY: cut, schedule, microbatches, recompute)")  # fmt: skip
    plan.add_argument("--profile", type=input_file, default=None,
                      help="profile JSON (pp profile -o); it sets the model")  # fmt: skip
    add_size(plan, ranks=2, microbatches=None)
    plan.add_argument("--ilp", type=positive_float, default=None, metavar="SECONDS",
                      help="also run the exact solver for this long")  # fmt: skip
    plan.add_argument("-o", "--output", "--out", type=output_file, default=None,
                      help="the best schedule as torch CSV (default plan.csv); with --model "
                           "MODULE:FACTORY the plan's JSON (default plan.json)")  # fmt: skip
    plan.add_argument("--plot", type=plot_file, default=None,
                      help="--model MODULE:FACTORY: the Gantt chart of the plan above the naive "
                           "1F1B (default: the --out file as .png)")  # fmt: skip
    plan.add_argument("--recompute", action="store_true",
                      help="also weigh every schedule with activation checkpointing")  # fmt: skip
    plan.add_argument("--memory-limit-mib", type=positive_float, default=None, metavar="MIB",
                      help="keep the fastest whose peak activations per rank fit")  # fmt: skip
    plan.add_argument("--overhead-ms", type=nonneg_float, default=None, metavar="MS",
                      help="--model MODULE:FACTORY: the runtime's cost per action (default: "
                           "measured on --ranks local ranks, with the cost per byte moved; "
                           "given, transfers cost 0; 0: compute only)")  # fmt: skip
    add_model(plan)
    add_launch(plan)
    add_json_flag(plan)
    plan.set_defaults(func=_plan)

    run = sub.add_parser("run", help="train a model with a schedule or a plan on local ranks")
    which = run.add_mutually_exclusive_group(required=True)
    which.add_argument("--schedule", "-s", help="schedule name (gpipe, 1f1b, zb-h1, ...)")
    which.add_argument("--schedule-file", type=input_file, help="torch compute-only CSV")
    which.add_argument("--plan", type=input_file,
                       help="plan JSON of pp plan --model MODULE:FACTORY (with that --model)")  # fmt: skip
    add_size(run, ranks=None, ranks_required=False, microbatches=None)
    run.add_argument("--steps", type=positive_int, default=3, help="training steps")
    run.add_argument("--optimizer", choices=("sgd", "adamw"), default="sgd")
    run.add_argument("--lr", type=positive_float, default=0.01)
    run.add_argument("--no-predict", action="store_true", help="skip profiling + simulation")
    run.add_argument("--recompute", action="store_true",
                     help="activation checkpointing: F keeps its input, B runs F again")  # fmt: skip
    run.add_argument("--trace", type=output_file, default=Path("nobubble-out/pp_run_trace.json"),
                     help="merged Chrome trace to write")  # fmt: skip
    run.add_argument("--plot", type=plot_file, default=None,
                     help="PNG/SVG: the last measured step above the simulated one")  # fmt: skip
    run.add_argument("--dispatch", choices=DISPATCH_CHOICES, default="static",
                     help="walk the schedule, or pick each op from what has arrived")  # fmt: skip
    run.add_argument("--straggler", type=straggler_arg, default=None, metavar="RANK:FACTOR[:STEPS]",
                     help="really slow one rank: its ops take FACTOR times as long")  # fmt: skip
    add_model(run)
    add_launch(run)
    add_json_flag(run)
    run.set_defaults(func=_run)


def measure_profile(model: ModelConfig, num_stages: int, launch: LaunchOptions, *,
                    microbatch_size: int, clock: str, repeats: int = 3, comm: bool = True):  # fmt: skip
    """Profile ``model`` split into ``num_stages`` stages (+ T_comm over 2 local ranks),
    under a spinner: :func:`~nobubble.pipeline.runtime.profile.profile_stages` where
    ``launch`` runs the ranks."""
    from nobubble.pipeline.runtime.profile import profile_stages

    with console(stderr=True).status(f"profiling {num_stages} stages of {model.name}"):
        return profile_stages(
            model, num_stages, microbatch_size=microbatch_size, device=launch.device,
            backend=launch.backend, repeats=repeats, clock=clock,
            threads=launch.threads_per_rank, comm=comm, timeout_s=launch.timeout_s,
        )  # fmt: skip


def _profile(args: argparse.Namespace) -> int:
    from nobubble.distributed import check_device

    if is_user_model(args.model):
        raise UsageError("pp profile takes the built-in models (--model gpt|mlp); a model of "
                         "your own is profiled block by block by pp plan --model MODULE:FACTORY")  # fmt: skip
    model = model_from_args(args)
    launch = check_launch(args, None, model)
    claim = claim_output(args.output) if args.output is not None else contextlib.nullcontext()
    with claim:  # before torch: refuse another live run's output
        check_device(launch.device, launch.backend)
        prof = measure_profile(model, args.num_stages, launch,
                               microbatch_size=args.microbatch_size, clock=args.clock,
                               repeats=args.repeats, comm=not args.no_comm)  # fmt: skip
        if args.output is not None:
            prof.write(args.output)
    rows = [
        [s.stage, f"{s.blocks[0]}-{s.blocks[-1]}", s.t_f, s.t_b, s.t_w, s.t_b + s.t_w,
         s.t_bw_fused, f"{s.split_overhead:+.1%}", s.mem_f / MiB, s.mem_w / MiB]
        for s in prof.stages
    ]  # fmt: skip
    print_result(
        args.json, prof.to_dict(),
        f"{model.name}: {args.num_stages} stages, microbatch {args.microbatch_size} (ms, MiB)",
        ["stage", "blocks", "T_F", "T_B", "T_W", "T_B+T_W", "fused BW", "split", "M_F", "M_W"],
        rows, caption=f"T_comm {prof.t_comm:.3f} ms; {prof.clock} clock",
        files=[str(args.output)] if args.output is not None else [],
    )  # fmt: skip
    return 0


def _plan(args: argparse.Namespace) -> int:
    from nobubble.distributed import check_device

    if is_user_model(args.model):
        check_factory_flags(args)
        return plan_user_model(args, check_launch(args, args.ranks, None))
    for flag, given in (("--plot", args.plot), ("--overhead-ms", args.overhead_ms)):
        if given is not None:
            raise UsageError(f"{flag} applies to --model MODULE:FACTORY; a built-in model's "
                             "plan is drawn by pp simulate --plot and measures its own costs")  # fmt: skip
    if args.profile is not None and given_model_flags(args):
        raise UsageError(f"--profile {args.profile} sets the model; drop "
                         f"{', '.join(given_model_flags(args))} (or profile that model "
                         "with pp profile -o)")  # fmt: skip
    args.microbatches = args.microbatches or DEFAULT_MICROBATCHES
    check_size(args, "compare")  # every schedule is generated and simulated, as pp compare
    model = model_from_args(args) if args.profile is None else None
    launch = check_launch(args, args.ranks, model)
    prof = read_profile_json(args.profile, "--profile") if args.profile is not None else None
    out = args.output or Path("plan.csv")
    with claim_output(out):  # before torch: refuse another live run's output
        check_device(launch.device, launch.backend, ranks=args.ranks)
        p, name = _plan_builtin(args, prof, model, launch)
        write_text(out, p.schedule().to_csv())
    rows = [describe(p, c)[1] for c in p.candidates]
    if args.json:
        print_json({"best": p.schedule_name, "recompute": p.recompute[0], "output": str(out),
                    "schedules": rows})  # fmt: skip
        return 0
    print_candidates(
        f"P={args.ranks}, M={args.microbatches}, profiled costs ({name})",
        [("chosen" if c == p.chosen else str(i + 1), r)
         for i, (c, r) in enumerate(zip(p.candidates, rows, strict=True))],
        naive=None, limited=args.memory_limit_mib is not None,
        caption=f"best: {p.schedule_name}"
        + (" (run it with --recompute)" if p.recompute[0] else "") + f" -> {out}",
    )  # fmt: skip
    return 0


def _plan_builtin(args: argparse.Namespace, prof: Profile | None, model: ModelConfig | None,
                  launch: LaunchOptions) -> tuple[Plan, str]:  # fmt: skip
    """The plan of :func:`~nobubble.pipeline.runtime.planning.plan_from_profile` (``--profile``'s
    ``prof``) or :func:`~nobubble.pipeline.runtime.planning.plan_builtin` (``model``), and the
    model's name."""
    from nobubble.pipeline.runtime.planning import plan_builtin, plan_from_profile

    limit = args.memory_limit_mib * MiB if args.memory_limit_mib is not None else None
    with console(stderr=True).status("planning") as status:
        if prof is not None:
            return plan_from_profile(
                prof, num_ranks=args.ranks, num_microbatches=args.microbatches,
                recompute=args.recompute, memory_limit=limit, ilp_time_limit_s=args.ilp,
            ), prof.model  # fmt: skip
        assert model is not None  # no --profile
        return plan_builtin(
            model, num_ranks=args.ranks, num_microbatches=args.microbatches,
            microbatch_size=args.microbatch_size, recompute=args.recompute, memory_limit=limit,
            ilp_time_limit_s=args.ilp, device=launch.local_device, clock=args.clock,
            threads=launch.threads_per_rank, timeout_s=launch.timeout_s, progress=status.update,
        ), model.name  # fmt: skip


def _schedule_from_args(args: argparse.Namespace) -> Schedule:
    """``--schedule`` for unit costs (a cost-dependent one is built again for the costs a
    profile measures), or ``--schedule-file``."""
    from nobubble.pipeline.costs import CostModel

    if args.schedule is not None:
        args.microbatches = args.microbatches or DEFAULT_MICROBATCHES
        check_size(args)  # before the unit costs, whose size is the ranks'
        return schedule_from_args(args, CostModel.uniform(args.ranks))
    sched = read_schedule_csv(args.schedule_file, "--schedule-file")
    if sched.num_ranks != args.ranks:
        raise UsageError(
            f"{args.schedule_file} has {sched.num_ranks} ranks but --ranks is {args.ranks}; "
            f"pass --ranks {sched.num_ranks}"
        )
    if args.microbatches not in (None, sched.num_microbatches):
        raise UsageError(f"-m {args.microbatches}, but {args.schedule_file} runs "
                         f"{sched.num_microbatches} microbatches; drop -m (the file sets it)")  # fmt: skip
    args.microbatches = sched.num_microbatches
    return sched


def _run(args: argparse.Namespace) -> int:
    if args.plan is not None:
        check_factory_flags(args)
        return run_user_plan(args, check_launch(args, args.ranks, None))
    if is_user_model(args.model):
        raise UsageError("--model MODULE:FACTORY runs a plan: give --plan plan.json (write one "
                         "with pp plan --model MODULE:FACTORY --out plan.json)")  # fmt: skip
    if args.ranks is None:
        raise UsageError("--ranks is required with --schedule or --schedule-file")
    sched = _schedule_from_args(args)  # unit costs until profiled; sets --microbatches
    model = model_from_args(args)
    launch = check_launch(args, args.ranks, model)  # sizes, steps: with M known
    torchrun = "RANK" in os.environ and "WORLD_SIZE" in os.environ
    # before torch: refuse another live run's output (under torchrun each rank claims its own)
    with contextlib.nullcontext() if torchrun else claim_output(args.trace):
        from nobubble.distributed import check_device
        from nobubble.pipeline.runtime.executor import TrainConfig, check_config

        check_device(launch.device, launch.backend, ranks=args.ranks)
        config = TrainConfig(
            model=model, schedule=sched, microbatch_size=args.microbatch_size,
            num_steps=args.steps, optimizer=args.optimizer, lr=args.lr, data_seed=args.seed,
            recompute=args.recompute, dispatch=args.dispatch, straggler=args.straggler,
        )  # fmt: skip
        check_config(config, sched.num_ranks)  # before profiling or starting anything
        return (_run_torchrun if torchrun else _run_local)(config, args, launch)


def _run_local(config, args: argparse.Namespace, launch: LaunchOptions) -> int:
    from nobubble.pipeline.runtime.launch import merged_events, run_local
    from nobubble.pipeline.runtime.report import summarize_run
    from nobubble.trace import write_chrome_trace

    prof = None
    if not args.no_predict:
        prof = measure_profile(config.model, config.schedule.num_stages, launch,
                               microbatch_size=config.microbatch_size, clock=args.clock)  # fmt: skip
        from nobubble.pipeline.schedules import COST_DEPENDENT_SCHEDULES

        if args.schedule in COST_DEPENDENT_SCHEDULES:  # their order adapts to the costs
            config = replace(config, schedule=schedule_from_args(args, prof.cost_model()))
    sched = config.schedule
    # the ranks run from the main thread, so Ctrl-C and SIGTERM reach spawn's clean-up
    with console(stderr=True).status(f"running {sched.name} on {sched.num_ranks} ranks"):
        (results,) = run_local([config], launch)
    summary = summarize_run(config, results, prof)
    write_chrome_trace(args.trace, merged_events(results))
    extra = {"trace": str(args.trace)}
    if args.plot is not None:
        from nobubble.pipeline.runtime.plot_run import plot_measured_vs_simulated
        from nobubble.pipeline.runtime.report import simulate_run

        sim = simulate_run(config, prof) if prof is not None else None
        extra["plot"] = str(
            plot_measured_vs_simulated(args.plot, results, sim, step=config.num_steps - 1)
        )
    if args.json:
        print_json({**summary.to_dict(), **extra})
        return 0
    _print_run(summary, ", ".join(f"{k}: {v}" for k, v in extra.items()))
    return 0


def _print_run(s, files: str) -> None:
    pred = s.sim_makespan_s is not None

    def opt(v, fmt):
        return fmt(v) if v is not None else "-"

    rows = [
        ["step makespan (ms)", s.makespan_s * 1e3, opt(s.sim_makespan_s, lambda v: v * 1e3)],
        ["step time incl. optimizer (ms)", s.step_time_s * 1e3, "-"],
        ["bubble rate", f"{s.bubble_rate:.1%}", opt(s.sim_bubble_rate, lambda v: f"{v:.1%}")],
    ]
    for r, b in enumerate(s.peak_activation_bytes):
        p = s.sim_peak_activation_bytes[r] / MiB if pred else "-"
        rows.append([f"peak activations rank {r} (MiB)", b / MiB, p])
    rows.append(["loss first -> last step", f"{s.losses[0]:.4f} -> {s.losses[-1]:.4f}", "-"])
    print_table(
        f"{s.schedule}: {s.num_ranks} ranks, {s.num_stages} stages, M={s.num_microbatches}, "
        f"median of {s.num_steps} steps",
        ["", "measured", "simulated"],
        rows,
        caption=files,
    )


def _run_torchrun(config, args: argparse.Namespace, launch: LaunchOptions) -> int:
    from nobubble.pipeline.runtime.launch import run_torchrun
    from nobubble.trace import write_chrome_trace

    rank = int(os.environ["RANK"])  # each rank its own file, claimed before it starts
    path = args.trace.with_name(f"{args.trace.stem}.rank{rank}{args.trace.suffix}")
    with claim_output(path):
        (res,) = run_torchrun([config], launch)  # destroys its process group
        write_chrome_trace(path, res.events)
    if res.losses is not None:  # the rank of the last stage speaks for the run
        med = statistics.median(res.step_times_s)
        if args.json:
            print_json({"rank": res.rank, "median_step_time_s": med, "losses": list(res.losses),
                        "trace": str(path)})  # fmt: skip
        else:
            console().print(
                f"rank {res.rank} (last stage): median step {med * 1e3:.1f} ms, loss "
                f"{res.losses[0]:.4f} -> {res.losses[-1]:.4f}; trace {path} (one per rank)"
            )
    return 0
