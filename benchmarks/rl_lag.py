"""Learning under lag: the presets against naive PPO, with a slow trainer, on digits.

The issue's setting: the trainer takes +0.3 s per step (``--trainer-delay``), so generators
run far ahead and samples arrive up to ``--max-staleness`` (8) versions old. Each run stops
at 0.9 accuracy or after ``--budget`` seconds (300). Runs:

- ``aggressive``: ``--preset aggressive`` at max staleness 8 (V-trace inside PPO's clip,
  1 / (1 + lag) weights, prioritized replay), one run per seed;
- ``naive PPO``: GRPO's clipped loss against the behaviour policy, the same lag, no fix;
- ``conservative``: ``--preset conservative`` (one-step-off, lag <= 1), one run per seed.

Writes ``benchmarks/results/rl_lag.json`` (time to 0.9, final accuracy, samples/s per run).

    python -m benchmarks.rl_lag                 # 3 seeds, about 20-35 minutes here
    python -m benchmarks.rl_lag --seeds 0 --budget 120
"""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path
from typing import Any

from benchmarks._common import write_record
from benchmarks.records.rl_lag import RlLag
from nobubble.rl import RunConfig, train
from nobubble.rl.system.config import TrainerConfig
from nobubble.rl.system.config.presets import PRESETS, aggressive, conservative

OUT = Path(__file__).resolve().parent / "results" / "rl_lag.json"


def runs(args: argparse.Namespace) -> dict[str, RunConfig]:
    common: dict[str, Any] = dict(
        steps=100_000, time_budget_s=args.budget, target_accuracy=0.9, eval_every=10,
        timeout_s=args.budget + 300,
    )  # fmt: skip
    slow = TrainerConfig(delay_s=args.trainer_delay)
    out = {}
    for seed in args.seeds:
        fast = aggressive(RunConfig(mode="fully-async", trainer=slow, seed=seed, **common))
        out[f"aggressive s{seed}"] = replace(fast, max_staleness=args.max_staleness)
        out[f"conservative s{seed}"] = conservative(
            RunConfig(mode="one-step-off", trainer=slow, seed=seed, **common)
        )
    out[f"naive PPO s{args.seeds[0]}"] = RunConfig(
        mode="fully-async", algo="grpo", max_staleness=args.max_staleness,
        trainer=slow, seed=args.seeds[0], **common,
    )  # fmt: skip
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--budget", type=float, default=300.0, help="seconds per run")
    p.add_argument("--trainer-delay", type=float, default=0.3)
    p.add_argument("--max-staleness", type=int, default=8)
    p.add_argument("--out", type=Path, default=OUT)
    args = p.parse_args()
    rows = []
    for name, cfg in runs(args).items():
        res = train(cfg)
        rows.append(
            {
                "run": name,
                "preset": next((p for p in PRESETS if name.startswith(p)), None),
                "algo": cfg.algo,
                "max_staleness": cfg.effective_max_staleness,
                "steps": res.steps,
                "wall_s": res.wall_s,
                "samples_per_s": res.samples_per_s,
                "final_accuracy": res.final_accuracy,
                "t_to_0.9_s": res.time_to_accuracy(0.9),
                "staleness_max": res.staleness_max,
                "reused": res.ledger.reused,
                "ledger_ok": res.ledger.ok,
            }
        )
        print(rows[-1], flush=True)
    setup = {k: v for k, v in vars(args).items() if k != "out"}
    write_record(args.out, RlLag, {"setup": setup, "rows": rows})
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
