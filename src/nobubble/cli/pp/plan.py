"""``nobubble pp plan | run --model MODULE:FACTORY``: plan a model of your own, then run it.

FACTORY (``package.module:factory`` or ``path/to/file.py:factory``) takes no arguments and
returns ``(blocks, inputs, targets, loss_fn)``: the model as modules in pipeline order (each
takes one tensor and returns one), one step's batch, and ``loss_fn(output, targets)``, a
mean over the rows::

    nobubble pp plan --model my_model.py:factory --ranks 2 [--memory-limit-mib 64] [-m 8] \\
        --out plan.json [--plot plan.png]
    nobubble pp run --plan plan.json --model my_model.py:factory --steps 5

``pp plan`` is a thin layer over :func:`nobubble.pipeline.runtime.planning.plan_model`,
which measures the runtime's own costs, profiles each block once in this process and chooses
the cut, schedule, microbatch count and recompute: the command chooses nothing itself. It
prints the chosen plan, the next candidates and, beside them, the naive plan (equal block
counts, 1F1B, the same microbatches, no recompute), draws the chosen schedule above the
naive one on one time axis and writes the plan's JSON. ``pp run --plan`` trains with it on local ranks, each calling the
factory (:func:`nobubble.pipeline.runtime.planning.train.train_plan`).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import os
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from nobubble.cli.pp.options import BUILTIN_MODELS, check_time, is_user_model
from nobubble.cli.preflight import load_user_object
from nobubble.cli.util import (
    UsageError,
    check_budget,
    console,
    print_json,
    print_table,
)
from nobubble.files import claim_output, write_text

if TYPE_CHECKING:
    from nobubble.distributed.options import LaunchOptions
    from nobubble.pipeline.plan import Candidate, Plan
    from nobubble.pipeline.runtime.planning.train import UserModel
    from nobubble.pipeline.simulate import SimResult

__all__ = [
    "describe",
    "print_candidates",
    "load_user_model",
    "plan_user_model",
    "run_user_plan",
]

MiB = 1024 * 1024
TOP_CANDIDATES = 8
"""Rows of the plan table: the chosen plan, then the next fastest candidates."""


def load_user_model(spec: str, *, seed: int) -> UserModel:
    """Import the factory ``spec`` names and build the model with it
    (:meth:`UserModel.from_factory <nobubble.pipeline.runtime.planning.UserModel.from_factory>`,
    which seeds torch with ``seed`` and checks the factory's answer).

    Every rank calls this with the same ``seed``, so every rank builds the same weights.
    Raises UsageError (one line, exit 2) when ``spec`` does not import, is not callable,
    the factory raises, or it does not return ``(blocks, inputs, targets, loss_fn)``.
    """
    from nobubble.pipeline.runtime.planning.train import UserModel
    from nobubble.rl.system.imports import is_import_path

    if not is_import_path(spec):
        raise UsageError(f"--model {spec!r}: give {' or '.join(BUILTIN_MODELS)}, or your own "
                         "model's factory as package.module:factory or path/to/file.py:factory")  # fmt: skip
    factory = load_user_object("--model", spec, "--model")
    try:
        return UserModel.from_factory(factory, seed=seed)
    except ValueError as err:
        raise UsageError(f"--model {spec!r}: {err}") from err


def _absolute(spec: str) -> str:
    """``spec`` with a file path made absolute: the ranks may start in another folder."""
    head, _, attr = spec.rpartition(":")
    return f"{Path(head).expanduser().resolve()}:{attr}" if head.endswith(".py") else spec


# -- pp plan --model MODULE:FACTORY --------------------------------------------------------
def plan_user_model(args: argparse.Namespace, launch: LaunchOptions) -> int:
    """``pp plan --model MODULE:FACTORY``: plan, print the table, draw, write the JSON."""
    from nobubble.distributed import check_device
    from nobubble.pipeline.runtime.planning import RuntimeCosts, plan_model

    if args.profile is not None:
        raise UsageError("--profile applies to the built-in models (--model gpt|mlp); a model "
                         "of your own is profiled block by block here")  # fmt: skip
    out = args.output if args.output is not None else Path("plan.json")
    plot = args.plot if args.plot is not None else out.with_suffix(".png")
    runtime = RuntimeCosts(args.overhead_ms, 0.0) if args.overhead_ms is not None else None
    limit = args.memory_limit_mib * MiB if args.memory_limit_mib is not None else None
    with claim_output(out):  # before profiling: refuse another live run's output
        check_device(launch.device, launch.backend, ranks=args.ranks)
        model = load_user_model(args.model, seed=args.seed)
        with console(stderr=True).status("planning") as status:
            p = plan_model(
                [b.to(launch.local_device) for b in model.blocks], model.inputs,
                model.targets, model.loss_fn, num_ranks=args.ranks,
                num_microbatches=args.microbatches, memory_limit=limit, runtime=runtime,
                device=launch.device, threads=launch.threads_per_rank,
                timeout_s=launch.timeout_s, ilp_time_limit_s=args.ilp, clock=args.clock,
                progress=status.update,
            )  # fmt: skip
        naive = describe(p, p.naive())
        rows = [describe(p, c) for c in _shown(p)]
        _draw(p, rows[0][0], naive, plot)
        write_text(out, p.to_json())
    if args.json:
        print_json({"output": str(out), "plot": str(plot), "chosen": rows[0][1],
                    "candidates": [r for _, r in rows], "naive_1f1b": naive[1]})  # fmt: skip
        return 0
    naive_ms = naive[1]["predicted_step_ms"]
    console().print(  # the factory's name as written: no markup, no :emoji: codes
        f"{args.model}: plan for {p.num_blocks} blocks on {p.num_ranks} ranks: stages "
        f"{'+'.join(map(str, p.stage_sizes()))}, {p.schedule_name}, m={p.num_microbatches}, "
        f"recompute {'on' if p.recompute[0] else 'off'}; predicted {p.predicted_step_ms:.4g} ms "
        f"a step, {naive_ms / p.predicted_step_ms:.2f}x the naive plan's {naive_ms:.4g} ms",
        markup=False, emoji=False,
    )  # fmt: skip
    print_candidates(
        f"the chosen plan and the next of {len(p.candidates)} candidates weighed",
        [("chosen" if i == 0 else str(i + 1), r) for i, (_, r) in enumerate(rows)],
        naive=naive[1], limited=args.memory_limit_mib is not None,
        caption="predicted by the simulator from each block's costs, profiled once here "
        f"({launch.threads_per_rank} thread(s)); naive: equal blocks per rank, 1F1B, the "
        f"same m, no recompute; wrote {out}, {plot}",
    )  # fmt: skip
    return 0


def _shown(p: Plan) -> list[Candidate]:
    """The chosen candidate, then the fastest others (those that do not fit included)."""
    return [p.chosen, *[c for c in p.candidates if c != p.chosen][: TOP_CANDIDATES - 1]]


def describe(p: Plan, c: Candidate) -> tuple[SimResult, dict]:
    """A candidate's simulated step and its row of the table (and of ``--json``)."""
    from nobubble.pipeline.plan import sizes_from_cuts

    sim = p.simulate(c)
    return sim, {
        "stage_sizes": list(sizes_from_cuts(c.cuts, p.num_blocks)), "schedule": c.schedule,
        "num_microbatches": c.num_microbatches, "recompute": c.recompute[0],
        "predicted_step_ms": c.predicted_step_ms, "bubble_rate": sim.bubble_rate,
        "peak_mib_per_rank": [b / MiB for b in c.predicted_peak_bytes], "fits": c.fits,
    }  # fmt: skip


def print_candidates(title: str, rows: list[tuple[str, dict]], *, naive: dict | None,
                     limited: bool, caption: str) -> None:  # fmt: skip
    """The table of a plan's candidates (each row :func:`describe`'s, after its label), and
    the ``naive`` plan's row and each one's speed-up over it; ``limited``: whether it fits."""
    naive_ms = naive["predicted_step_ms"] if naive is not None else None

    def cells(label: str, r: dict) -> list:
        return [label, "+".join(map(str, r["stage_sizes"])), r["schedule"], r["num_microbatches"],
                "yes" if r["recompute"] else "no", r["predicted_step_ms"],
                f"{r['bubble_rate']:.1%}", " / ".join(f"{b:.3g}" for b in r["peak_mib_per_rank"]),
                *([f"{naive_ms / r['predicted_step_ms']:.2f}x"] if naive_ms else []),
                *(["yes" if r["fits"] else "no"] if limited else [])]  # fmt: skip

    table = [cells(label, r) for label, r in rows]
    table += [cells("naive", naive)] if naive is not None else []
    columns = ["", "stage sizes", "schedule", "m", "recompute", "step ms", "bubble",
               "peak MiB per rank", *(["vs naive"] if naive_ms else []),
               *(["fits"] if limited else [])]  # fmt: skip
    print_table(title, columns, table, caption=caption)


def _draw(p: Plan, chosen_sim: SimResult, naive: tuple[SimResult, dict], path: Path) -> Path:
    """The chosen plan's simulated step above the naive plan's, on one time axis."""
    from nobubble.pipeline.plot import gantt_grid

    def titled(sim: SimResult, who: str, sizes: Sequence[int], recompute: bool) -> SimResult:
        name = (f"{who}: {sim.schedule.name}, stages {'+'.join(map(str, sizes))}, "
                f"m={sim.schedule.num_microbatches}{', recompute' if recompute else ''}")  # fmt: skip
        return dataclasses.replace(sim, schedule=sim.schedule.renamed(name))

    return gantt_grid([titled(chosen_sim, "plan", p.stage_sizes(), p.recompute[0]),
                       titled(naive[0], "naive", naive[1]["stage_sizes"], False)], path)  # fmt: skip


# -- pp run --plan plan.json --model MODULE:FACTORY ----------------------------------------
def run_user_plan(args: argparse.Namespace, launch: LaunchOptions) -> int:
    """``pp run --plan``: the plan on local ranks, each building the model from the factory."""
    from nobubble.distributed import check_device
    from nobubble.pipeline.runtime.planning.train import train_plan

    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        raise UsageError("pp run --plan starts its own local ranks; run it without torchrun")
    from nobubble.pipeline.plan import Plan

    try:
        p = Plan.read(args.plan)
    except ValueError as err:
        raise UsageError(f"--plan {err}") from None
    _check_run_args(args, p)
    check_budget("pp run", processes=p.num_ranks, force=args.force)
    spec = _absolute(args.model)
    model = load_user_model(spec, seed=args.seed)  # checked here, before any rank starts
    model.check_plan(p)  # another block count, or a batch the plan's microbatches do not split
    batch = int(model.inputs.shape[0])
    if p.setting.batch_size not in (None, batch):
        console(stderr=True).print(f"note: {args.plan} was planned for a batch of "
                                   f"{p.setting.batch_size} rows, this one has {batch}; the "
                                   "prediction is for the planned batch")  # fmt: skip
    args.microbatches = p.num_microbatches
    check_time(args, p.num_ranks, model.num_parameters, model.batch_tokens // p.num_microbatches)
    check_device(launch.device, launch.backend, ranks=p.num_ranks)
    with console(stderr=True).status(f"running {p.schedule_name} on {p.num_ranks} ranks"):
        run = train_plan(p, functools.partial(load_user_model, spec, seed=args.seed),
                         steps=args.steps, optimizer=args.optimizer, lr=args.lr,
                         dispatch=args.dispatch, backend=launch.backend, device=launch.device,
                         timeout_s=launch.timeout_s, threads=launch.threads_per_rank)  # fmt: skip
    losses, step_ms = list(run.losses), list(run.step_ms)
    measured = statistics.median(step_ms[1:] or step_ms)  # the first step warms up
    if args.json:
        print_json({"schedule": p.schedule_name, "num_ranks": p.num_ranks,
                    "stage_sizes": list(p.stage_sizes()), "num_microbatches": p.num_microbatches,
                    "recompute": p.recompute[0], "losses": losses, "step_ms": step_ms,
                    "median_step_ms": measured, "predicted_step_ms": p.predicted_step_ms})  # fmt: skip
        return 0
    print_table(
        f"{args.plan}: {p.schedule_name}, stages {'+'.join(map(str, p.stage_sizes()))}, "
        f"m={p.num_microbatches}, recompute {'on' if p.recompute[0] else 'off'}, "
        f"{p.num_ranks} ranks",
        ["step", "loss", "step ms", "predicted ms"],
        [
            [i, f"{loss:.6g}", ms, p.predicted_step_ms]
            for i, (loss, ms) in enumerate(zip(losses, step_ms, strict=True))
        ],  # fmt: skip
        caption=f"median step {measured:.4g} ms"
        + (" (after the first)" if len(step_ms) > 1 else "")
        + f" = {measured / p.predicted_step_ms:.2f}x the predicted {p.predicted_step_ms:.4g} ms",
    )
    return 0


def _check_run_args(args: argparse.Namespace, p: Plan) -> None:
    if not is_user_model(args.model):
        raise UsageError("--plan runs a plan of your own model: give the factory it was made "
                         "from, --model MODULE:FACTORY")  # fmt: skip
    if args.ranks is not None and args.ranks != p.num_ranks:
        raise UsageError(f"--ranks {args.ranks}, but {args.plan} is a plan for {p.num_ranks} "
                         "ranks; drop --ranks (the plan sets it) or plan again")  # fmt: skip
    if args.microbatches is not None and args.microbatches != p.num_microbatches:
        raise UsageError(f"--microbatches {args.microbatches}, but {args.plan} runs "
                         f"{p.num_microbatches}; drop -m (the plan sets it) or plan again")  # fmt: skip
    given = [flag for flag, on in (("--recompute", args.recompute), ("--plot", args.plot),
                                   ("--straggler", args.straggler)) if on]  # fmt: skip
    if given:
        raise UsageError(f"{', '.join(given)}: not with --plan (the plan sets recompute; "
                         "plotting and stragglers are for the built-in models)")  # fmt: skip
