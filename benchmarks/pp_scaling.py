"""How simulation and schedule generation scale with the number of actions.

The simulator parks a blocked rank on the key it waits for and wakes it when that key is
produced, so each action is handled a constant number of times: time per action should stay
flat as p and m grow. The baseline, run in the same process, is the obvious simulator that
sweeps over all ranks again and again, advancing each as far as it can, until nothing moves
(its cost grows with the number of sweeps). Also times the issue's target: zb-2p for
p = 32, m = 256 generated and simulated (< 3 s).

    .venv/bin/python -m benchmarks.pp_scaling [--quick] [--repeats N]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

from benchmarks._common import write_record
from benchmarks.records.pp_scaling import PpScaling
from nobubble.bench.output import print_table
from nobubble.pipeline import CostModel, get_schedule, simulate
from nobubble.pipeline.validate import dep_key, dependencies

ROOT = Path(__file__).resolve().parents[1]


def sweep_simulate(schedule, costs) -> float:
    """Baseline: sweep all ranks until no rank can advance; returns the makespan."""
    finished: dict = {}
    pos = [0] * schedule.num_ranks
    free = [0.0] * schedule.num_ranks
    moved = True
    while moved:
        moved = False
        for r, acts in enumerate(schedule.rank_actions):
            while pos[r] < len(acts):
                a = acts[pos[r]]
                deps = dependencies(a, schedule.num_stages)
                if any(d not in finished for d in deps):
                    break
                t = free[r]
                for d in deps:
                    comm = costs.t_comm if schedule.stage_to_rank[d[1]] != r else 0.0
                    t = max(t, finished[d] + comm)
                free[r] = finished[dep_key(a)] = t + costs.duration(a)
                pos[r] += 1
                moved = True
    return max(free)


def _median_time(fn, repeats: int) -> tuple[float, float]:
    """Median wall and CPU (process) seconds; CPU time is what load on a shared box inflates
    least."""
    wall, cpu = [], []
    for _ in range(repeats):
        w0, c0 = time.perf_counter(), time.process_time()
        fn()
        wall.append(time.perf_counter() - w0)
        cpu.append(time.process_time() - c0)
    return statistics.median(wall), statistics.median(cpu)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller sizes, 1 repeat")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument(
        "--json-out", type=Path, default=ROOT / "benchmarks/results/pp_scaling.json"
    )
    args = parser.parse_args()
    repeats = 1 if args.quick else args.repeats
    sizes = [(4, 16), (8, 32), (8, 128), (16, 128), (32, 256)]
    if not args.quick:
        sizes += [(32, 512), (64, 512)]
    rows = []
    for p, m in sizes:
        costs = CostModel.uniform(p, t_f=1.0, t_b=1.0, t_w=0.5, t_comm=0.05)
        sched = get_schedule("zb-h1", num_ranks=p, num_microbatches=m)
        n = sched.num_actions
        ours, ours_cpu = _median_time(lambda s=sched, c=costs: simulate(s, c), repeats)
        base, base_cpu = _median_time(lambda s=sched, c=costs: sweep_simulate(s, c), repeats)
        assert abs(sweep_simulate(sched, costs) - simulate(sched, costs).makespan) < 1e-6
        rows.append({"p": p, "m": m, "actions": n, "simulate_s": ours, "simulate_cpu_s": ours_cpu,
                     "cpu_us_per_action": ours_cpu / n * 1e6, "sweep_baseline_s": base,
                     "sweep_baseline_cpu_s": base_cpu, "cpu_ratio": base_cpu / ours_cpu})  # fmt: skip
    paper = CostModel.paper(32, t_f=10.402, t_b=10.248, t_w=7.698, t_comm=0.46,
                            hidden=6144, heads=48, seq=1024)  # fmt: skip
    gen, gen_cpu = _median_time(lambda: get_schedule("zb-2p", num_ranks=32, num_microbatches=256,
                                                     costs=paper), repeats)  # fmt: skip
    sched = get_schedule("zb-2p", num_ranks=32, num_microbatches=256, costs=paper)
    sim, sim_cpu = _median_time(lambda: simulate(sched, paper), repeats)
    print_table("simulate zb-h1 (median of repeats): CPU time per action, flat = linear in "
                "actions; baseline = sweep all ranks until nothing moves",
                ["p", "m", "actions", "wall s", "CPU s", "CPU us / action", "baseline CPU s",
                 "baseline / ours"],
                [[r["p"], r["m"], r["actions"], r["simulate_s"], r["simulate_cpu_s"],
                  f"{r['cpu_us_per_action']:.1f}", r["sweep_baseline_cpu_s"],
                  f"{r['cpu_ratio']:.2f}x"] for r in rows])  # fmt: skip
    per_action = [r["cpu_us_per_action"] for r in rows if r["actions"] >= 1000]
    spread = max(per_action) / min(per_action)
    print(
        f"zb-2p p=32 m=256 ({sched.num_actions} actions): generate {gen:.3f} s + simulate "
        f"{sim:.3f} s = {gen + sim:.3f} s wall (target < 3 s); CPU {gen_cpu:.3f} + "
        f"{sim_cpu:.3f} s; CPU us/action max/min over >= 1000 actions = {spread:.2f}"
    )
    args.json_out.parent.mkdir(parents=True, exist_ok=True)
    write_record(args.json_out, PpScaling, {"rows": rows, "zb2p_p32_m256": {
        "generate_s": gen, "simulate_s": sim, "total_s": gen + sim, "generate_cpu_s": gen_cpu,
        "simulate_cpu_s": sim_cpu, "actions": sched.num_actions},
        "cpu_us_per_action_max_over_min": spread, "repeats": repeats,
        "load_average": os.getloadavg()})  # fmt: skip
    print(f"wrote {args.json_out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
