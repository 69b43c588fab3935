"""DualPipe and DualPipeV beside ZB-V and 1F1B on the Zero Bubble paper's 12 configurations.

For each configuration (model, p, m, measured T_F/T_B/T_W/T_comm, the paper's memory model)
simulate dualpipev, zb-v and 1f1b on p ranks, and DualPipe on p ranks through its fold
(DualPipeV on p/2 ranks, m/2 microbatches, one rank's costs per stage: exact at T_comm = 0,
otherwise it leaves out the transfers at the middle, so its bubble is a lower bound). Record
the bubble rate, the peak activation memory in rank units (one microbatch's activations of
one rank's share of the model; 1F1B: p) and the parameters per rank (DualPipe holds two
copies). The F&B cells run back to back: the simulator models no overlap inside a cell.

    .venv/bin/python -m benchmarks.pp_dualpipe [--quick] [--json-out PATH]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from benchmarks._common import paper_costs, paper_rows, print_bubble_memory, write_record
from benchmarks.records.pp_dualpipe import PpDualpipe
from nobubble.pipeline import get_schedule, simulate
from nobubble.pipeline.schedules.dualpipe import dualpipe, dualpipev

ROOT = Path(__file__).resolve().parents[1]
NAMES = ("dualpipe", "dualpipev", "zb-v", "1f1b")
PARAMS_PER_RANK = {"dualpipe": 2.0, "dualpipev": 1.0, "zb-v": 1.0, "1f1b": 1.0}


def run_row(row) -> dict:
    """One configuration: every schedule's bubble rate, peak memory and cells per rank."""
    p, m = int(row["p"]), int(row["m"])
    costs = paper_costs(row)  # one entry per rank: per stage for DualPipe's fold (p stages)
    out: dict = {"model": row["model"], "p": p, "m": m, "schedules": {}}
    for name in NAMES:
        t0 = time.perf_counter()
        overlapped = (
            dualpipe(p, m).folded if name == "dualpipe"
            else dualpipev(p, m) if name == "dualpipev" else None
        )  # fmt: skip
        if overlapped is None:
            sched = get_schedule(name, num_ranks=p, num_microbatches=m, costs=costs)
        else:
            sched = overlapped.schedule
        cells = 0 if overlapped is None else max(len(k) for k in overlapped.pairs)
        result = simulate(sched, costs)
        out["schedules"][name] = {
            "bubble_rate": result.bubble_rate,
            "peak_memory": max(result.peak_memory) / costs.mem_f[0],
            "params_per_rank": PARAMS_PER_RANK[name],
            "overlapped_cells_per_rank": cells,
            "seconds": time.perf_counter() - t0,
        }
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="only the p=8 rows")
    parser.add_argument("--json-out", type=Path,
                        default=ROOT / "benchmarks/results/pp_dualpipe.json")  # fmt: skip
    args = parser.parse_args()
    results = [run_row(r) for r in paper_rows(args.quick)]
    print_bubble_memory(NAMES, results)
    args.json_out.parent.mkdir(parents=True, exist_ok=True)
    note = ("dualpipe: simulated through its fold (dualpipev on p/2 ranks, m/2 microbatches); "
            "a lower bound on its bubble when T_comm > 0. F&B cells run back to back.")  # fmt: skip
    write_record(args.json_out, PpDualpipe, {"note": note, "rows": results})
    print(f"wrote {args.json_out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
