"""PipelineRunner against torch.distributed.pipelining's runtime, same schedule, same run.

The model is the GPT of ``examples/train_gpt.py`` (plain ``torch.nn``), split over 2 gloo
ranks. For each schedule, torch's ``_PipelineScheduleRuntime`` (loaded through
:func:`nobubble.pipeline.to_torch`) and :class:`nobubble.pipeline.PipelineRunner` run
alternately on the same batch, one step each, ``--steps`` times after a warm-up. The report
gives each path's median step time (then the median over ``--rounds`` independent runs in
fresh processes, each run's ratio listed too), the ratio ``runner / torch`` (below 1:
nobubble is faster) and each path's speed-up of the zero-bubble schedules over 1F1B, next
to the speed-up the simulator predicts twice: from a profile of the same stages taken beforehand
(:func:`nobubble.pipeline.runtime.profile.profile_modules`, thread CPU time, one
microbatch), and from the op times the runner measured in the run itself (``OpTimes``, the
costs re-planning would use). The schedules are built once from the profile, so ranks and
simulator time the same orders. CPU measurements on a shared machine: read the ratios, not
the milliseconds.

    .venv/bin/python -m benchmarks.pp_runner_vs_torch [--steps 12] [--rounds 3] [--quick]
"""

from __future__ import annotations

import argparse
import statistics
import time

from benchmarks._common import write_json
from benchmarks.records.pp_runner_vs_torch import PpRunnerVsTorch
from examples.train_gpt import SEQ, corpus, gpt, loss_fn
from nobubble.bench.output import print_table
from nobubble.distributed import spawn
from nobubble.pipeline import (
    PipelineRunner,
    get_schedule,
    simulate,
    split_model,
    to_torch,
)
from nobubble.pipeline.runtime.profile import (
    OpTimes,
    costs_from_op_times,
    measure_comm,
    profile_modules,
)

SCHEDULES = ("1f1b", "zb-h1", "zb-2p")


def _torch_step(runtime, own, num_stages, x, y) -> None:
    kwargs = {"target": y} if num_stages - 1 in own else {}
    runtime.step(*((x,) if 0 in own else ()), **kwargs)


def _batch(batch: int):
    import torch

    text = corpus()
    chars = sorted(set(text))
    data = torch.tensor([chars.index(c) for c in text[: 64 * 1024]])
    g = torch.Generator().manual_seed(0)
    start = torch.randint(0, len(data) - SEQ - 1, (batch,), generator=g)
    window = torch.stack([data[s : s + SEQ + 1] for s in start.tolist()])
    return len(chars), window[:, :-1], window[:, 1:]


def profiled_costs(batch: int, microbatches: int):
    """The simulator's costs from a profile of the 2 stages (one microbatch, CPU time)."""
    import torch

    torch.set_num_threads(1)  # as each rank runs
    vocab, x, y = _batch(batch)
    rows = batch // microbatches
    prof = profile_modules(split_model(gpt(vocab), 2), x[:rows], y[:rows], loss_fn,
                           repeats=5, clock="cpu")  # fmt: skip
    return prof.cost_model()


def rank_main(ctx, schedules, steps: int, batch: int) -> dict:
    import torch

    vocab, x, y = _batch(batch)
    rows = batch // schedules[0].num_microbatches
    hidden = gpt(vocab)[0](x[:rows]).shape  # the boundary activation of one microbatch
    t_comm = measure_comm(ctx, hidden)
    out = {"t_comm_ms": t_comm}
    for sched in schedules:
        own = sched.stages_of(ctx.rank)
        torch_stages = split_model(gpt(vocab), sched.num_stages)
        runtime = to_torch(torch_stages, sched, loss_fn)
        timer = OpTimes()  # the runner's own op times, for the in-run simulation
        runner = PipelineRunner(
            split_model(gpt(vocab), sched.num_stages),
            sched,
            loss_fn,
            static_shapes=True,
            observer=timer,
        )  # as torch: shapes fixed at the first step
        times: dict[str, list[float]] = {"torch": [], "nobubble": []}
        for i in range(steps + 2):
            if i == 2:
                timer.clear()  # the first two steps warm up
            for path in ("torch", "nobubble") if i % 2 == 0 else ("nobubble", "torch"):
                torch.distributed.barrier()
                t0 = time.perf_counter()
                if path == "torch":
                    _torch_step(runtime, own, sched.num_stages, x, y)
                else:
                    runner.step(x, y)
                torch.distributed.barrier()
                if i >= 2:
                    times[path].append(time.perf_counter() - t0)
        runner.close()
        out[sched.name] = {p: statistics.median(t) for p, t in times.items()}
        out[sched.name]["op_ms"] = timer.medians()
    return out


def _in_run_makespans(per_rank: list[dict], schedules) -> dict[str, float]:
    """Each schedule simulated with the op times its own runner run measured (ms)."""
    t_comm = per_rank[0]["t_comm_ms"]
    out = {}
    for sched in schedules:
        merged = {k: v for r in per_rank for k, v in r[sched.name]["op_ms"].items()}
        costs = costs_from_op_times(merged, sched.num_stages, t_comm=t_comm)
        out[sched.name] = simulate(sched, costs).makespan
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=12, help="timed steps per path and schedule")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--microbatches", type=int, default=4)
    ap.add_argument(
        "--rounds",
        type=int,
        default=3,
        help="independent runs (fresh processes); the report gives their medians",
    )
    ap.add_argument("--quick", action="store_true", help="3 steps, for a smoke run")
    args = ap.parse_args()
    steps = 3 if args.quick else args.steps
    if args.rounds < 1 or steps < 1:
        ap.error(f"--rounds {args.rounds} and --steps {steps} must be >= 1")
    costs = profiled_costs(args.batch, args.microbatches)
    # the automatic schedules (zb-2p) adapt to the profiled costs: build them once, here, so
    # that the ranks run and the simulator times the very same orders
    schedules = [get_schedule(name, num_ranks=2, num_microbatches=args.microbatches,
                              costs=costs) for name in SCHEDULES]  # fmt: skip
    sim = {sched.name: simulate(sched, costs).makespan for sched in schedules}
    rounds = []
    for i in range(args.rounds):
        per_rank = spawn(rank_main, 2, args=(schedules, steps, args.batch), timeout_s=1800)
        rounds.append(_round_rows(per_rank, schedules, sim))
        print(
            f"round {i + 1}/{args.rounds}: nobubble / torch "
            + ", ".join(f"{r['schedule']} {r['nobubble_over_torch']:.3f}" for r in rounds[-1])
        )
    rows = _median_rows(rounds)
    import torch

    path = write_json("pp_runner_vs_torch", PpRunnerVsTorch, {
        "ranks": 2, "batch": args.batch, "microbatches": args.microbatches, "seq_len": SEQ,
        "steps": steps, "rounds": args.rounds, "quick": args.quick, "torch": torch.__version__,
        "rows": rows,
    })  # fmt: skip
    _print(rows, steps, args.rounds)
    print(f"wrote {path}")


def _round_rows(per_rank: list[dict], schedules, sim: dict[str, float]) -> list[dict]:
    """One round's row per schedule."""
    # a step ends at a barrier: every rank measured the same step; take rank 0's
    res = per_rank[0]
    in_run = _in_run_makespans(per_rank, schedules)
    rows = []
    for name in SCHEDULES:
        t, n = res[name]["torch"], res[name]["nobubble"]
        measured, model = res["1f1b"]["nobubble"] / n, sim["1f1b"] / sim[name]
        replayed = in_run["1f1b"] / in_run[name]
        rows.append({
            "schedule": name,
            "torch_step_s": t,
            "nobubble_step_s": n,
            "nobubble_over_torch": n / t,
            "torch_speedup_vs_1f1b": res["1f1b"]["torch"] / t,
            "nobubble_speedup_vs_1f1b": measured,
            "predicted_makespan_ms": sim[name],
            "predicted_speedup_vs_1f1b": model,
            "speedup_error": measured / model - 1,
            "in_run_makespan_ms": in_run[name],
            "in_run_speedup_vs_1f1b": replayed,
            "in_run_speedup_error": measured / replayed - 1,
            "in_run_step_error": n * 1e3 / in_run[name] - 1,
        })  # fmt: skip
    return rows


def _median_rows(rounds: list[list[dict]]) -> list[dict]:
    """Per schedule, the median over rounds of every figure; each round's ratio is kept."""
    out = []
    for i, name in enumerate(SCHEDULES):
        mine = [r[i] for r in rounds]
        row: dict = {"schedule": name}
        for key, value in mine[0].items():
            if isinstance(value, float):
                row[key] = statistics.median(r[key] for r in mine)
        row["nobubble_over_torch_per_round"] = [r["nobubble_over_torch"] for r in mine]
        out.append(row)
    return out


def _print(rows: list[dict], steps: int, rounds: int) -> None:
    print_table(
        f"PipelineRunner vs torch's runtime, GPT of examples/train_gpt.py on 2 ranks "
        f"(medians of {steps} steps, then of {rounds} rounds)",
        [
            "schedule",
            "torch ms",
            "nobubble ms",
            "nobubble / torch",
            "torch vs 1f1b",
            "nobubble vs 1f1b",
            "simulated vs 1f1b",
            "error",
            "in-run sim vs 1f1b",
            "error",
            "step vs in-run sim",
        ],  # fmt: skip
        [
            [
                r["schedule"],
                1e3 * r["torch_step_s"],
                1e3 * r["nobubble_step_s"],
                f"{r['nobubble_over_torch']:.3f}",
                f"{r['torch_speedup_vs_1f1b']:.3f}x",
                f"{r['nobubble_speedup_vs_1f1b']:.3f}x",
                f"{r['predicted_speedup_vs_1f1b']:.3f}x",
                f"{r['speedup_error']:+.1%}",
                f"{r['in_run_speedup_vs_1f1b']:.3f}x",
                f"{r['in_run_speedup_error']:+.1%}",
                f"{r['in_run_step_error']:+.1%}",
            ]
            for r in rows
        ],  # fmt: skip
    )


if __name__ == "__main__":
    main()
