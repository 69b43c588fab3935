"""Generator scaling: fully-async samples/s with 1, 2 and 4 rollout workers.

Generation is made the bottleneck two ways, each a knob of the run:

- ``wait``: every generate call also waits ``--wait`` seconds without using the CPU
  (``RolloutConfig.delay_s``), like a generator that waits on a remote inference server;
  generators overlap their waits, so samples/s should grow with their number until the
  trainer is the bottleneck;
- ``compute``: a wider policy (hidden 128) sampling 64 responses per prompt, so generation
  is CPU work. On this 2-core machine, with the trainer and the driver sharing the same
  cores, more generators cannot add compute: the honest expectation is a flat line.

Modes are interleaved round by round and medians reported (the machine is shared). Writes
``benchmarks/results/rl_generators.json``.

    python -m benchmarks.rl_generators
    python -m benchmarks.rl_generators --rounds 1 --steps 20
"""

from __future__ import annotations

import argparse
import os
import statistics
from pathlib import Path
from typing import Any

from benchmarks._common import write_record
from benchmarks.records.rl_generators import RlGenerators
from nobubble.rl import RunConfig, train
from nobubble.rl.system.config import RolloutConfig

OUT = Path(__file__).resolve().parent / "results" / "rl_generators.json"
GENERATORS = (1, 2, 4)


def config(knob: str, generators: int, args: argparse.Namespace) -> RunConfig:
    common: dict[str, Any] = dict(
        mode="fully-async", steps=args.steps, eval_every=10_000, batch_groups=8,
        num_rollout_workers=generators, groups_per_rollout=2, seed=0,
    )  # fmt: skip
    if knob == "wait":
        return RunConfig(group_size=16, rollout=RolloutConfig(delay_s=args.wait), **common)
    return RunConfig(
        group_size=64, policy_kwargs={"hidden": 128, "num_layers": 2, "num_heads": 4}, **common
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--wait", type=float, default=0.05, help="seconds per generate call")
    p.add_argument("--out", type=Path, default=OUT)
    args = p.parse_args()
    samples: dict[str, dict[int, list[float]]] = {
        k: {g: [] for g in GENERATORS} for k in ("wait", "compute")
    }
    busy: dict[str, dict[int, list[dict[str, float]]]] = {
        k: {g: [] for g in GENERATORS} for k in ("wait", "compute")
    }
    for rnd in range(args.rounds):
        for knob in ("wait", "compute"):
            for g in GENERATORS:
                res = train(config(knob, g, args))
                samples[knob][g].append(res.samples_per_s)
                busy[knob][g].append(res.idle_ratio)
                print(f"round {rnd} {knob} generators={g}: {res.samples_per_s:.0f} samples/s")
    rows = []
    for knob, per in samples.items():
        base = statistics.median(per[1])
        for g, values in per.items():
            med = statistics.median(values)
            rows.append(
                {
                    "knob": knob,
                    "generators": g,
                    "samples_per_s": med,
                    "speedup_vs_1": med / base,
                    "idle_trainer": statistics.median(b["trainer"] for b in busy[knob][g]),
                    "runs": values,
                }
            )
    setup = {**{k: v for k, v in vars(args).items() if k != "out"}, "cpu_count": os.cpu_count()}
    write_record(args.out, RlGenerators, {"setup": setup, "rows": rows})
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
