"""Does asynchrony buy throughput without costing accuracy? sync vs one-step-off vs fully-async.

Learning: sync and fully-async (eta = 4) GRPO on digit completion, seeds 0..S-1, each for at
most ``--budget`` seconds (default 150, within the 5-minute claim; a run stops early once
accuracy reaches 0.95); one-step-off on seed 0. Throughput: the three modes with a wider
policy for a fixed number of steps, interleaved round by round, medians. All runs use the
local engine (generator and trainer in separate processes, one torch thread each).
Reported per run: samples/s (trained samples / wall-clock from the first eval to the last
step), accuracy on the enumerated eval set at the start and the end, the wall-clock time at
which accuracy first reached 0.9, staleness and idle ratios, and the busy seconds of
generation and training (to show that their costs are comparable).


    python -m benchmarks.rl_modes            # 3 seeds
    python -m benchmarks.rl_modes --quick    # 1 seed, fewer steps
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from benchmarks._common import write_record
from benchmarks.records.rl_modes import RlModes, ThroughputRow
from nobubble.bench.output import print_table
from nobubble.rl.system.orchestrator import RunConfig, RunResult, run
from nobubble.rl.system.result import plot_runs, write_trace

OUT = Path(__file__).parent / "results"
IMG = Path(__file__).parent.parent / "docs" / "img"


def _row(label: str, r: RunResult, base: RunResult) -> dict:
    return {
        "run": label,
        "steps": r.steps,
        "wall_s": r.wall_s,
        "samples_per_s": r.samples_per_s,
        "speedup": r.samples_per_s / base.samples_per_s,
        "acc_start": r.initial_accuracy,
        "acc_final": r.final_accuracy,
        "t_to_0.9_s": r.time_to_accuracy(0.9),
        "staleness_max": r.staleness_max,
        "idle_rollout": r.idle_ratio["rollout"],
        "idle_trainer": r.idle_ratio["trainer"],
        "busy_gen_s": r.busy_s["rollout"],
        "busy_train_s": r.busy_s["trainer"],
    }


def throughput(rounds: int, steps: int) -> list[dict]:
    """samples/s of the three modes with a wider policy (hidden 128), so that the stages'
    compute, not message passing, fills a step; modes interleaved round by round so that a
    change in the machine's other load hits all of them alike. Medians are reported."""
    per_mode: dict[str, list[RunResult]] = {m: [] for m in ("sync", "one-step-off", "fully-async")}
    for rnd in range(rounds):
        for mode, eta in (("sync", None), ("one-step-off", 1), ("fully-async", 4)):
            cfg = RunConfig(
                mode=mode,
                max_staleness=eta,
                steps=steps,
                seed=rnd,
                eval_every=steps,
                policy_kwargs={"hidden": 128, "num_layers": 2, "num_heads": 4},
            )
            res = run(cfg)
            per_mode[mode].append(res)
            print(
                f"  throughput round {rnd} {mode}: {res.samples_per_s:.0f} samples/s "
                f"(gen busy {res.busy_s['rollout']:.1f}s, train busy {res.busy_s['trainer']:.1f}s,"
                f" wall {res.wall_s:.1f}s)",
                flush=True,
            )
    base = statistics.median(r.samples_per_s for r in per_mode["sync"])
    rows = []
    for mode, rs in per_mode.items():
        sps = statistics.median(r.samples_per_s for r in rs)
        rows.append(
            {
                "mode": mode,
                "samples_per_s_median": sps,
                "samples_per_s_all": [r.samples_per_s for r in rs],
                "speedup": sps / base,
                "busy_gen_s_median": statistics.median(r.busy_s["rollout"] for r in rs),
                "busy_train_s_median": statistics.median(r.busy_s["trainer"] for r in rs),
                "idle_gen_median": statistics.median(r.idle_ratio["rollout"] for r in rs),
                "idle_train_median": statistics.median(r.idle_ratio["trainer"] for r in rs),
                "staleness_max": max(r.staleness_max for r in rs),
            }
        )
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="1 seed, fewer steps")
    ap.add_argument("--seeds", type=int, default=None)
    ap.add_argument("--steps", type=int, default=None)
    ap.add_argument("--only", choices=("learning", "throughput"), default=None)
    ap.add_argument(
        "--budget",
        type=float,
        default=150.0,
        help="seconds of training per learning run (stops early at 0.95)",
    )
    args = ap.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    name = "rl_modes_quick" if args.quick else "rl_modes"
    if args.only != "learning":
        rounds, tsteps = (1, 20) if args.quick else (3, 60)
        trows = throughput(rounds, tsteps)
        cols = list(trows[0])
        print_table(
            f"rl_modes throughput: hidden 128, {tsteps} steps, median of {rounds} rounds",
            cols,
            [[r[c] for c in cols] for r in trows],
        )
        write_record(OUT / f"{name}_throughput.json", list[ThroughputRow], trows, indent=1)
        if args.only == "throughput":
            return
    seeds = args.seeds or (1 if args.quick else 3)
    steps = args.steps or (60 if args.quick else 3000)
    runs: dict[str, RunResult] = {}
    rows = []
    t_start = time.time()
    for seed in range(seeds):
        plan = [("sync", None), ("fully-async", 4)]
        if seed == 0:
            plan.insert(1, ("one-step-off", 1))
        base = None
        for mode, eta in plan:
            cfg = RunConfig(
                mode=mode,
                max_staleness=eta,
                steps=steps,
                seed=seed,
                eval_every=10,
                time_budget_s=args.budget,
                target_accuracy=0.95,
            )
            label = f"{mode} s{seed}"
            print(f"running {label} (<= {steps} steps, <= {args.budget:.0f}s) ...", flush=True)
            res = run(cfg)
            base = base or res
            runs[label] = res
            rows.append(_row(label, res, base))
            print(
                f"  {res.samples_per_s:.1f} samples/s, acc {res.initial_accuracy:.3f} -> "
                f"{res.final_accuracy:.3f}, t(0.9)={res.time_to_accuracy(0.9)}",
                flush=True,
            )
    cols = list(rows[0])
    print_table(
        f"rl_modes learning: digits, <= {args.budget:.0f}s per run, local engine ({time.time() - t_start:.0f}s total)",
        cols,
        [[r[c] if r[c] is not None else "-" for c in cols] for r in rows],
    )
    summary = {}
    for mode in ("sync", "fully-async"):
        acc = [r["acc_final"] for r in rows if r["run"].startswith(mode + " ")]
        t09 = [r["t_to_0.9_s"] for r in rows if r["run"].startswith(mode + " ")]
        sps = [r["samples_per_s"] for r in rows if r["run"].startswith(mode + " ")]
        summary[mode] = {
            "acc_final_mean": statistics.mean(acc),
            "acc_final_min": min(acc),
            "acc_final_max": max(acc),
            "t_to_0.9_s": t09,
            "samples_per_s_mean": statistics.mean(sps),
        }
    speed = {r["run"]: r["speedup"] for r in rows if not r["run"].startswith("sync")}
    print("summary:", json.dumps(summary, indent=1))
    print("speed-up over sync (same seed):", {k: round(v, 2) for k, v in speed.items()})
    write_record(
        OUT / f"{name}.json",
        RlModes,
        {
            "rows": rows,
            "summary": summary,
            "speedup": speed,
            "curves": {k: r.to_json()["curve"] for k, r in runs.items()},
        },
        indent=1,
    )
    seed0 = {k.split(" ")[0]: v for k, v in runs.items() if k.endswith("s0")}
    plot_runs(seed0, IMG / "rl_modes.png", title=f"digits, {steps} steps, seed 0")
    traces = Path("nobubble-out") / "rl"  # several MB each: kept out of the repository
    write_trace(runs["fully-async s0"], traces / "rl_modes_fully_async_trace.json")
    write_trace(runs["sync s0"], traces / "rl_modes_sync_trace.json")
    print(f"wrote {OUT / (name + '.json')} and {IMG / 'rl_modes.png'}")


if __name__ == "__main__":
    main()
