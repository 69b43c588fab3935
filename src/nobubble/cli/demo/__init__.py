"""``nobubble demo``: a tour of every capability, a step a ``nobubble`` command
(:func:`_command`) or, where no command shows it, a function of :mod:`.showcase`; it ends
with a table of step times and artifacts."""

from __future__ import annotations

import argparse
import random
import time
from collections.abc import Callable
from pathlib import Path

from nobubble.cli.demo import showcase
from nobubble.cli.util import ArgumentParser, console, output_dir, print_table, seed_int

Step = Callable[[Path, bool, int], list[Path]]


def register(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", type=output_dir, default=Path("nobubble-out"),
                        help="artifact folder (default ./nobubble-out)")  # fmt: skip
    parser.add_argument("--quick", action="store_true", help="smallest sizes in every step")
    parser.add_argument("--only", default=None,
                        help="comma-separated step titles to run (e.g. merge,trace)")  # fmt: skip
    parser.add_argument("--seed", type=seed_int, default=0, help="random seed (default 0)")
    parser.set_defaults(func=_run)


def _command(*argv: str | Path, wrote: tuple[Path, ...] = ()) -> list[Path]:
    """Run ``nobubble ARGV`` as the user would; its ``Path`` arguments (their folders made
    first) and ``wrote`` are the step's artifacts. A failure stops the tour."""
    from nobubble.cli import ep, pp, rl, trace

    artifacts = [a for a in argv if isinstance(a, Path)] + list(wrote)
    for path in artifacts:
        path.parent.mkdir(parents=True, exist_ok=True)
    line = " ".join(map(str, argv))
    console().print(f"$ nobubble {line}")
    parser = ArgumentParser(prog=f"nobubble {argv[0]}")
    {"pp": pp, "ep": ep, "rl": rl, "trace": trace}[str(argv[0])].register(parser)
    args = parser.parse_args(list(map(str, argv[1:])))
    rc = args.func(args)
    if rc:
        raise RuntimeError(f"demo step: `nobubble {line}` exited {rc}")
    return artifacts


def _trace_step(out: Path, quick: bool, seed: int) -> list[Path]:
    """Four ranks each write their own trace; ``nobubble trace merge`` makes one time-ordered
    file of them and prints each rank's busy and idle time."""
    from nobubble.trace import Event, write_chrome_trace

    rng = random.Random(seed)
    files = []
    for rank in range(4):
        t, events = rank * 150.0, []  # later ranks start later: the pipeline fill bubble
        for i in range(8):
            dur = rng.uniform(80, 120)
            events.append(Event(f"step{i}", "compute", rank, t, dur, {"microbatch": i}))
            t += dur + rng.uniform(0, 40)  # waiting for the neighbour
        files.append(write_chrome_trace(out / "trace" / f"rank{rank}.json", events))
    return _command("trace", "merge", *files, "-o", out / "trace" / "merged.json")


def _schedules_step(out: Path, quick: bool, seed: int) -> list[Path]:
    """1F1B's grid beside ZB-H1's (P=4, M=8, unit costs: W fills the bubbles), then every
    schedule at P=8, M=24 on the paper's 1.5B costs, their Gantt charts in one image."""
    for name in ("1f1b", "zb-h1"):
        _command("pp", "show", "-s", name, "-p", "4", "-m", "8")
    return _command("pp", "compare", "-p", "8", "-m", "24", "--model", "1.5B",
                    "--plot", out / "pipeline_gantt.png", *(["--no-torch"] if quick else []))  # fmt: skip


def steps() -> list[tuple[str, Step]]:
    """The demo's steps in the order they run: (title, run(out_dir, quick, seed) -> artifacts)."""
    return [
        ("merge", showcase.merge),
        ("trace", _trace_step),
        ("pipeline schedules", _schedules_step),
        # the exact solver against the heuristic where memory is tight (3 M_F per stage)
        ("pipeline ILP", lambda out, quick, seed: _command(
            "pp", "solve", "-p", "4", "-m", "8", "--model", "1.5B", "--mem-limit", "3",
            "--time-limit", "20", "--plot", out / "pipeline" / "ilp_optimal.png")),
        # every schedule as (peak activation memory, bubble), the Pareto set drawn
        ("pipeline frontier", lambda out, quick, seed: _command(
            "pp", "frontier", "-p", "8", "-m", "24", "--model", "1.5B",
            "--plot", out / "pipeline" / "frontier_p8_m24_1.5B.png")),
        ("pipeline handshake", showcase.handshake),
        # ZB-H1 on a real GPT split over 2 local processes, measured against the simulator
        ("pipeline runtime", lambda out, quick, seed: _command(
            "pp", "run", "-s", "zb-h1", "-p", "2", "-m", "4", "--steps", "2" if quick else "3",
            "--trace", out / "pipeline" / "run_zb-h1_trace.json",
            "--plot", out / "pipeline" / "run_zb-h1.png")),
        # a model of torch's own modules planned by `pp plan --model MODULE:FACTORY`: the
        # chosen cut, schedule, microbatches and recompute beside the naive equal-block 1F1B
        ("pipeline planning", lambda out, quick, seed: _command(
            "pp", "plan", "--model", "nobubble.cli.demo.pipeline_plan:factory", "--ranks", "2",
            "--seed", str(seed), "--out", out / "pipeline" / "plan.json",
            "--plot", out / "pipeline" / "plan.png")),
        ("pipeline re-planning", showcase.replan),
        ("MoE expert parallelism", showcase.moe),
        ("MoE fast paths", showcase.moe_fastpath),
        ("MoE load balancing", showcase.moe_balance),
        # GRPO on digit completion in the three modes on the same steps: what asynchrony buys
        # (samples/s, idle ratios) and costs (staleness); curves and each stage's trace
        ("RL", lambda out, quick, seed: _command(
            "rl", "compare", "--steps", "15" if quick else "200",
            "--eval-every", "2" if quick else "33", "--seed", str(seed), "--out", str(out / "rl"),
            wrote=(out / "rl" / "compare.png",))),
        # SEED RL on CartPole-v1: central batched inference, actors only step environments
        ("RL actor-learner", lambda out, quick, seed: _command(
            "rl", "train", "--env", "CartPole-v1", "--arch", "seed", "--seed", str(seed),
            "--target-return", "150" if quick else "475",
            "--time-budget", "60" if quick else "120", "--out", str(out / "rl"),
            wrote=(out / "rl" / "train_seed.png",))),
    ]  # fmt: skip


def _run(args: argparse.Namespace) -> int:
    con = console()
    out: Path = args.out
    chosen = steps()
    if args.only is not None:  # checked before the artifact folder is made
        wanted, names = {w.strip() for w in args.only.split(",")} - {""}, [t for t, _ in chosen]
        if not wanted:
            raise ValueError(f"--only {args.only!r} names no step; choose from {names}")
        if wanted - set(names):
            raise ValueError(f"--only: unknown step(s) {sorted(wanted - set(names))}; "
                             f"choose from {names}")  # fmt: skip
        chosen = [(t, f) for t, f in chosen if t in wanted]
    out.mkdir(parents=True, exist_ok=True)
    timings = []
    for i, (title, fn) in enumerate(chosen, 1):
        con.rule(f"[bold]{i}/{len(chosen)} {title}")
        t0 = time.perf_counter()
        artifacts = fn(out, args.quick, args.seed)
        timings.append((title, time.perf_counter() - t0, artifacts))
    con.rule("[bold]summary")
    print_table(
        f"nobubble demo: artifacts in {out.resolve()}",
        ["step", "seconds", "artifacts"],
        [[t, dt, ", ".join(str(p) for p in a) or "-"] for t, dt, a in timings],
    )
    return 0
