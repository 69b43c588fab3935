"""Every schedule at P=8, M=24 on the Zero Bubble paper's 1.5B and 6.2B costs.

The same computation as ``nobubble pp compare -p 8 -m 24 --model 1.5B`` (and ``--model
6.2B``): our generators and torch's own schedules (``torch.distributed.pipelining``, when
this torch has them) built and simulated on the paper's measured per-rank times and its
memory model, through :func:`nobubble.pipeline.compare.compare_schedules`. Bubble, peak
activation memory and throughput are relative to 1F1B (throughput = 1F1B's max span over the
schedule's; ``throughput_vs_1f1b_flush`` = the makespan ratio). Deterministic simulator
output: no timing, a few seconds to run.

    .venv/bin/python -m benchmarks.pp_compare     # writes benchmarks/results/pp_compare.json
"""

from __future__ import annotations

import argparse
import importlib.metadata

from benchmarks._common import write_json
from benchmarks.records.pp_compare import PpCompare
from nobubble.bench.output import print_table
from nobubble.pipeline import CostModel
from nobubble.pipeline.compare import compare_schedules
from nobubble.pipeline.costs import PAPER_TIMES

P, M = 8, 24
CHUNKS = 2  # v of interleaved-1f1b, the CLI's default
MODELS = ("1.5B", "6.2B")


def _torch_version() -> str | None:
    try:
        return importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        return None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.parse_args()
    models = {}
    for model in MODELS:
        costs = CostModel.paper_model(model, P)  # `--model MODEL`'s costs
        rows = [r.as_dict() for r in compare_schedules(costs, num_stages=P, num_microbatches=M,
                                                       num_chunks=CHUNKS)]  # fmt: skip
        models[model] = {"costs": dict(zip(("t_f", "t_b", "t_w", "t_comm"), PAPER_TIMES[model])),
                         "rows": rows}  # fmt: skip
        table = [
            [r["schedule"], r["source"], f"{r['bubble_rate']:.2%}",
             f"{r['peak_memory_vs_1f1b']:.2f}x", f"{r['throughput_vs_1f1b']:.3f}x",
             f"{r['throughput_vs_1f1b_flush']:.3f}x"]
            if r["bubble_rate"] is not None else [r["schedule"], r["source"], "-", "-", "-", "-"]
            for r in rows
        ]  # fmt: skip
        print_table(f"{model}: P={P}, M={M}",
                    ["schedule", "from", "bubble", "peak mem", "throughput", "with flush"],
                    table)  # fmt: skip
        for r in rows:
            if r["note"]:
                print(f"{r['schedule']}: {r['note']}")
    path = write_json("pp_compare", PpCompare, {"p": P, "m": M, "num_chunks": CHUNKS,
                                                "torch": _torch_version(), "models": models})  # fmt: skip
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
