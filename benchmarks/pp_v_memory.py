"""V-Min / V-Half / V-ZB on the Zero Bubble paper's 12 configurations, and the frontier.

For each configuration (model, p, m, measured T_F/T_B/T_W/T_comm, the paper's memory model)
build v-min, v-half, v-zb, zb-v, zb-1p and 1f1b, simulate them, and record the bubble rate
and the peak activation memory in rank units (one microbatch's activations on a rank; 1F1B:
p) beside the V schedules' bounds (p+4)/3, (p+2)/2 and p. Then time ``pp frontier``'s
points for P=8, M=24 on the 1.5B and 6.2B costs and draw docs/img/pp_frontier_p8_m24_*.png.

    .venv/bin/python -m benchmarks.pp_v_memory [--quick] [--json-out PATH] [--no-plots]
        [--img-dir DIR]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from benchmarks._common import paper_costs, paper_rows, print_bubble_memory, write_record
from benchmarks.records.pp_v_memory import PpVMemory
from nobubble.pipeline import frontier as fr
from nobubble.pipeline import get_schedule, simulate
from nobubble.pipeline.schedules.v_memory import MEMORY_BOUND

ROOT = Path(__file__).resolve().parents[1]
NAMES = ("v-min", "v-half", "v-zb", "zb-v", "zb-1p", "1f1b")


def run_row(row) -> dict:
    p, m = int(row["p"]), int(row["m"])
    costs = paper_costs(row)
    out: dict = {"model": row["model"], "p": p, "m": m, "schedules": {}}
    for name in NAMES:
        t0 = time.perf_counter()
        result = simulate(get_schedule(name, num_ranks=p, num_microbatches=m, costs=costs), costs)
        bound = MEMORY_BOUND[name](p) if name in MEMORY_BOUND else None
        peak = max(result.peak_memory) / costs.mem_f[0]
        out["schedules"][name] = {
            "bubble_rate": result.bubble_rate, "peak_memory": peak, "memory_bound": bound,
            "within_bound": bound is None or peak <= bound + 1e-9,
            "seconds": time.perf_counter() - t0,
        }  # fmt: skip
    return out


def run_frontier(model: str, img_dir: Path | None) -> dict:
    row = next(r for r in paper_rows()
               if r["model"] == model and r["p"] == "8" and r["m"] == "24")  # fmt: skip
    costs = paper_costs(row)
    t0 = time.perf_counter()
    # default_sources(8): our generators, ZB's automatic one at the default limits, torch's
    result = fr.frontier(costs, num_ranks=8, num_microbatches=24)
    seconds = time.perf_counter() - t0
    if img_dir is not None:
        from nobubble.pipeline.plot import frontier_plot

        frontier_plot(
            result.points,
            img_dir / f"pp_frontier_p8_m24_{model}.png",
            title=f"P=8, M=24, {model} costs: bubble vs peak activation memory",
        )
    return {"model": model, "seconds": seconds, "points": [q.as_dict() for q in result.points],
            "pareto": [q.name for q in result.pareto]}  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="only the p=8 rows")
    parser.add_argument("--no-plots", action="store_true", help="do not draw the frontiers")
    parser.add_argument("--img-dir", type=Path, default=ROOT / "docs/img",
                        help="where the frontier PNGs go (default docs/img)")  # fmt: skip
    parser.add_argument("--json-out", type=Path,
                        default=ROOT / "benchmarks/results/pp_v_memory.json")  # fmt: skip
    args = parser.parse_args()
    results = [run_row(r) for r in paper_rows(args.quick)]
    print_bubble_memory(NAMES, results)
    img_dir = None if args.no_plots else args.img_dir
    frontiers = [run_frontier(model, img_dir) for model in ("1.5B", "6.2B")]
    for f in frontiers:
        print(f"frontier {f['model']} P=8 M=24: {f['seconds']:.1f} s, Pareto: {f['pareto']}")
    all_ok = all(s["within_bound"] for r in results for s in r["schedules"].values())
    args.json_out.parent.mkdir(parents=True, exist_ok=True)
    write_record(args.json_out, PpVMemory, {"all_within_bound": all_ok, "rows": results,
                                              "frontiers": frontiers})  # fmt: skip
    print(f"all V schedules within their memory bound: {all_ok}; wrote {args.json_out}")
    return 0 if all_ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
