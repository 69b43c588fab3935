"""Every schedule at P=8, M=24 on the Zero Bubble paper's 1.5B and 6.2B costs.

The same computation as ``nobubble pp compare -p 8 -m 24 --model 1.5B`` (and ``--model
6.2B``): our generators and torch's own schedules (``torch.distributed.pipelining``, when
this torch has them) built and simulated on the paper's measured per-rank times and its
memory model, through :func:`nobubble.pipeline.compare.compare_schedules`. Bubble, peak
activation memory and throughput are relative to 1F1B (throughput = 1F1B's max span over the
schedule's; ``throughput_vs_1f1b_flush`` = the makespan ratio). Deterministic simulator
output: no timing, a few seconds to run.

    .venv/bin/python benchmarks/pp_compare.py     # writes benchmarks/results/pp_compare.json
"""

from __future__ import annotations

import argparse
import importlib.metadata
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import write_json  # noqa: E402

from nobubble.cli.pp.options import PAPER_TIMES  # noqa: E402
from nobubble.cli.util import print_table  # noqa: E402
from nobubble.pipeline import CostModel  # noqa: E402
from nobubble.pipeline.compare import compare_schedules  # noqa: E402
from nobubble.pipeline.costs import PAPER_MODELS  # noqa: E402

P, M = 8, 24
CHUNKS = 2  # v of interleaved-1f1b, the CLI's default
MODELS = ("1.5B", "6.2B")


def paper_costs(model: str, p: int) -> CostModel:
    """``--model MODEL``'s costs: the paper's measured times and its memory model."""
    t_f, t_b, t_w, t_comm = PAPER_TIMES[model]
    hidden, heads, _, seq = PAPER_MODELS[model]
    return CostModel.paper(
        p, t_f=t_f, t_b=t_b, t_w=t_w, t_comm=t_comm, hidden=hidden, heads=heads, seq=seq
    )


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
        costs = paper_costs(model, P)
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
    path = write_json("pp_compare", {"p": P, "m": M, "num_chunks": CHUNKS,
                                     "torch": _torch_version(), "models": models})  # fmt: skip
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
