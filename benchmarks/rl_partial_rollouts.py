"""Partial rollouts (weights taken between tokens) against whole-group versioning.

The ablation's slow-trainer setting (``nobubble rl compare --ablation``): digits, fully-async,
max staleness 8, one group per generate call, the trainer slowed by +0.3 s per step, GRPO's
clipped loss against the behaviour policy and no other lag fix, so the versioning is the only
difference between the two runs of a pair. Every run gets the same time budget
(``--budget`` seconds, no early stop). Two decoders:

- ``fast``: the ablation as it is. One generate call (32 responses of at most 3 tokens)
  takes milliseconds, so a trainer step almost never lands inside one;
- ``slow``: every decoding step also sleeps ``--token-delay`` seconds (0.1: a call of 3
  tokens lasts about one trainer step) and a call samples a whole batch (8 groups), as a
  long generation on a real inference server would. Here new weights do arrive mid-response.

Per run: samples/s, final and best accuracy, time to 0.9, the per-token staleness
histogram (trained response tokens by ``trainer version - the version that produced
them``), the per-group one, and how many generate calls took new weights mid-response.
Whole-group and partial runs alternate, seed by seed (the machine is shared). Writes
``benchmarks/results/rl_partial_rollouts.json``.

    python -m benchmarks.rl_partial_rollouts                  # 3 seeds x 2 decoders x 2, ~35 min
    python -m benchmarks.rl_partial_rollouts --seeds 0 --budget 30
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from benchmarks._common import write_record
from benchmarks.records.rl_partial_rollouts import RlPartialRollouts
from nobubble.rl import RunConfig, train
from nobubble.rl.system.config import RolloutConfig, TrainerConfig

OUT = Path(__file__).resolve().parent / "results" / "rl_partial_rollouts.json"
DECODERS = ("fast", "slow")
VERSIONING = ("whole-group", "partial")


def config(decoder: str, versioning: str, seed: int, args: argparse.Namespace) -> RunConfig:
    slow = decoder == "slow"
    return RunConfig(
        mode="fully-async", max_staleness=args.max_staleness, algo="grpo", seed=seed,
        steps=1_000_000, time_budget_s=args.budget, eval_every=10, timeout_s=args.budget + 300,
        groups_per_rollout=8 if slow else 1,
        rollout=RolloutConfig(token_delay_s=args.token_delay if slow else 0.0),
        trainer=TrainerConfig(delay_s=args.trainer_delay),
        partial_rollouts=versioning == "partial",
    )  # fmt: skip


def row(decoder: str, versioning: str, seed: int, res: Any) -> dict[str, Any]:
    hist = res.token_staleness_hist
    tokens = sum(hist.values())
    gens = [s for s in res.spans if s.stage == "rollout"]
    return {
        "decoder": decoder,
        "versioning": versioning,
        "seed": seed,
        "steps": res.steps,
        "wall_s": res.wall_s,
        "samples_per_s": res.samples_per_s,
        "final_accuracy": res.final_accuracy,
        "best_accuracy": max(p.accuracy for p in res.curve),
        "t_to_0.9_s": res.time_to_accuracy(0.9),
        "token_staleness_hist": {str(k): v for k, v in sorted(hist.items())},
        "token_lag_mean": sum(k * v for k, v in hist.items()) / max(1, tokens),
        "group_staleness_hist": {str(k): v for k, v in sorted(res.staleness_hist.items())},
        "generate_calls": len(gens),
        "updated_mid_response": sum(s.args.get("last", s.args["version"]) > s.args["version"]
                                    for s in gens),
        "dropped_stale": res.ledger.dropped["stale"],
        "ledger_ok": res.ledger.ok,
    }  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--budget", type=float, default=150.0, help="seconds per run")
    p.add_argument("--trainer-delay", type=float, default=0.3)
    p.add_argument("--token-delay", type=float, default=0.1, help="the slow decoder's s/token")
    p.add_argument("--max-staleness", type=int, default=8)
    p.add_argument("--decoders", nargs="+", choices=DECODERS, default=list(DECODERS))
    p.add_argument("--out", type=Path, default=OUT)
    args = p.parse_args()
    rows = []
    for i, seed in enumerate(args.seeds):
        for decoder in args.decoders:
            order = VERSIONING if i % 2 == 0 else VERSIONING[::-1]
            for versioning in order:
                res = train(config(decoder, versioning, seed, args))
                rows.append(row(decoder, versioning, seed, res))
                print(
                    {k: v for k, v in rows[-1].items() if k != "group_staleness_hist"}, flush=True
                )
    setup = {k: v for k, v in vars(args).items() if k != "out"}
    setup.update(
        task="digits", mode="fully-async", algo="grpo", groups_per_rollout={"fast": 1, "slow": 8}
    )
    write_record(args.out, RlPartialRollouts, {"setup": setup, "rows": rows})
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
