"""``nobubble demo``: a tour of every capability, each step of :data:`STEPS` a row of
``nobubble`` command lines run as the user would and, where no command shows it, functions of
:mod:`nobubble.bench.showcase`; it ends with a table of step times and artifacts."""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from pathlib import Path

from nobubble.bench import showcase
from nobubble.bench.output import console, print_table
from nobubble.cli.util import ArgumentParser, output_dir, seed_int

Step = Callable[[Path, bool, int], list[Path]]

STEPS: tuple[tuple[str, tuple[str | Step, ...]], ...] = (
    ("merge", (showcase.merge,)),
    # four ranks each write their own trace; `trace merge` orders them into one file
    ("trace", (showcase.rank_traces, "trace merge {out}/trace/rank0.json {out}/trace/rank1.json "
               "{out}/trace/rank2.json {out}/trace/rank3.json -o {out}/trace/merged.json")),
    # 1F1B's grid beside ZB-H1's (unit costs: W fills the bubbles), then every schedule on
    # the paper's 1.5B costs, their Gantt charts in one image
    ("pipeline schedules", ("pp show -s 1f1b -p 4 -m 8", "pp show -s zb-h1 -p 4 -m 8",
                            "pp compare -p 8 -m 24 --model 1.5B --plot {out}/pipeline_gantt.png "
                            "--no-torch|")),
    # the exact solver against the heuristic where memory is tight (3 M_F per stage)
    ("pipeline ILP", ("pp solve -p 4 -m 8 --model 1.5B --mem-limit 3 --time-limit 20 "
                      "--plot {out}/pipeline/ilp_optimal.png",)),
    # every schedule as (peak activation memory, bubble), the Pareto set drawn
    ("pipeline frontier", ("pp frontier -p 8 -m 24 --model 1.5B "
                           "--plot {out}/pipeline/frontier_p8_m24_1.5B.png",)),
    # ZB-H1 with rank 4 1.5x slow: the static order against the handshake, as Gantt charts
    ("pipeline handshake", tuple(
        f"pp simulate -s zb-h1 -p 8 -m 24 --model 1.5B --straggler 4:1.5 --dispatch {policy} "
        f"--plot {{out}}/pipeline/handshake_{policy}_p8_m24.png"
        for policy in ("static", "handshake"))),
    # ZB-H1 on a real GPT split over 2 local processes, measured against the simulator
    ("pipeline runtime", ("pp run -s zb-h1 -p 2 -m 4 --steps 2|3 "
                          "--trace {out}/pipeline/run_zb-h1_trace.json "
                          "--plot {out}/pipeline/run_zb-h1.png",)),
    # a model of torch's own modules planned by `pp plan --model MODULE:FACTORY`: the chosen
    # cut, schedule, microbatches and recompute beside the naive equal-block 1F1B
    ("pipeline planning", ("pp plan --model nobubble.bench.showcase:plan_model --ranks 2 "
                           "--seed {seed} --out {out}/pipeline/plan.json "
                           "--plot {out}/pipeline/plan.png",)),
    ("pipeline re-planning", (showcase.replan,)),
    ("MoE expert parallelism", (showcase.moe,)),
    ("MoE fast paths", (showcase.moe_fastpath,)),
    ("MoE load balancing", (showcase.moe_balance,)),
    # GRPO on digit completion in the three modes on the same steps: what asynchrony buys
    # (samples/s, idle ratios) and costs (staleness); curves and each stage's trace
    ("RL", ("rl compare --steps 15|200 --eval-every 2|33 --seed {seed} --out {out}/rl",)),
    # SEED RL on CartPole-v1: central batched inference, actors only step environments
    ("RL actor-learner", ("rl train --env CartPole-v1 --arch seed --seed {seed} "
                          "--target-return 150|475 --time-budget 60|120 --out {out}/rl",)),
)  # fmt: skip
"""The demo's steps in the order they run: (title, parts), a part a command line (a
``QUICK|FULL`` word takes the side ``--quick`` picks, an empty side drops it) or a
``step(out_dir, quick, seed) -> artifacts`` function."""


def register(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", type=output_dir, default=Path("nobubble-out"),
                        help="artifact folder (default ./nobubble-out)")  # fmt: skip
    parser.add_argument("--quick", action="store_true", help="smallest sizes in every step")
    parser.add_argument("--only", default=None,
                        help="comma-separated step titles to run (e.g. merge,trace)")  # fmt: skip
    parser.add_argument("--seed", type=seed_int, default=0, help="random seed (default 0)")
    parser.set_defaults(func=_run)


def run_step(title: str, out: Path, quick: bool, seed: int) -> list[Path]:
    """Run the parts of the step ``title``; its artifacts: what its functions return and its
    command lines' paths under ``out`` (their folders made first), a folder (``rl``'s
    ``--out``) as the files the command wrote into it. A failure stops the tour."""
    from nobubble.cli import ep, pp, rl, trace

    artifacts = []
    for part in dict(STEPS)[title]:
        if not isinstance(part, str):
            artifacts += part(out, quick, seed)
            continue
        words = [w.split("|")[0 if quick else 1] if "|" in w else w for w in part.split()]
        words = [w for w in words if w]
        argv = [w.format(out=out, seed=seed) for w in words]
        console().print(f"$ nobubble {' '.join(argv)}")
        paths = [Path(a) for w, a in zip(words, argv) if "{out}" in w]
        for path in paths:
            path.parent.mkdir(parents=True, exist_ok=True)
        before = _files(paths)
        parser = ArgumentParser(prog=f"nobubble {argv[0]}")
        {"pp": pp, "ep": ep, "rl": rl, "trace": trace}[argv[0]].register(parser)
        args = parser.parse_args(argv[1:])
        if rc := args.func(args):
            raise RuntimeError(f"demo step: `nobubble {' '.join(argv)}` exited {rc}")
        written = [f for f, stamp in _files(paths).items() if before.get(f) != stamp]
        artifacts += [p for p in paths if not p.is_dir()] + sorted(written)
    return list(dict.fromkeys(artifacts))


def _files(paths: list[Path]) -> dict[Path, int]:
    """Every file in the folders among ``paths``, with its modification time (ns)."""
    folders = [p for p in paths if p.is_dir()]
    return {f: f.stat().st_mtime_ns for d in folders for f in d.rglob("*") if f.is_file()}


def _run(args: argparse.Namespace) -> int:
    con = console()
    out: Path = args.out
    chosen = [title for title, _ in STEPS]
    if args.only is not None:  # checked before the artifact folder is made
        wanted, names = {w.strip() for w in args.only.split(",")} - {""}, chosen
        if not wanted:
            raise ValueError(f"--only {args.only!r} names no step; choose from {names}")
        if wanted - set(names):
            raise ValueError(f"--only: unknown step(s) {sorted(wanted - set(names))}; "
                             f"choose from {names}")  # fmt: skip
        chosen = [t for t in names if t in wanted]
    out.mkdir(parents=True, exist_ok=True)
    timings = []
    for i, title in enumerate(chosen, 1):
        con.rule(f"[bold]{i}/{len(chosen)} {title}")
        t0 = time.perf_counter()
        artifacts = run_step(title, out, args.quick, args.seed)
        timings.append((title, time.perf_counter() - t0, artifacts))
    con.rule("[bold]summary")
    print_table(
        f"nobubble demo: artifacts in {out.resolve()}",
        ["step", "seconds", "artifacts"],
        [[t, dt, ", ".join(str(p) for p in a) or "-"] for t, dt, a in timings],
    )
    return 0
