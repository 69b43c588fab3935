"""Many learners, stored: one learner against two with each aggregation mode, to 0.9 on digits.

``RunConfig(learners=2, aggregation=...)`` is ``nobubble rl train --learners 2
--aggregation ...``: two trainer processes in one gloo group, each on half of every batch.
Every run is fully-async (max staleness 4), GRPO, 8 groups x 32 responses per step, and
stops at 0.9 accuracy or after ``--budget`` seconds. On a 2-core machine the generator, the
reward worker and the learners share the cores, so the question this answers is whether
each mode learns, not whether two learners are faster.

Writes ``benchmarks/results/rl_learners.json``: per run the steps, time to 0.9, final and
best accuracy, samples/s, the ledger's samples per learner and the push staleness.

    python -m benchmarks.rl_learners                         # seeds 1 and 2, about 15 minutes
    python -m benchmarks.rl_learners --seeds 1 --modes async --budget 60 --quick
"""

from __future__ import annotations

import argparse

from benchmarks._common import write_json
from benchmarks.records.rl_learners import RlLearners
from nobubble.rl import RunConfig, train

MODES = ("one learner", "sync", "async", "staleness", "local-sgd")


def _config(mode: str, seed: int, budget: float) -> RunConfig:
    many = {} if mode == "one learner" else {"learners": 2, "aggregation": mode}
    return RunConfig(mode="fully-async", steps=100_000, time_budget_s=budget,
                     target_accuracy=0.9, eval_every=10, seed=seed, timeout_s=budget + 300,
                     **many)  # fmt: skip


def _row(mode: str, seed: int, res) -> dict:
    pushes = [m.get("push_staleness_max", 0.0) for m in res.step_metrics]
    return {
        "run": mode,
        "seed": seed,
        "learners": 1 if mode == "one learner" else 2,
        "steps": res.steps,
        "wall_s": res.wall_s,
        "t_to_0.9_s": res.time_to_accuracy(0.9),
        "final_accuracy": res.final_accuracy,
        "best_accuracy": max(p.accuracy for p in res.curve),
        "samples_per_s": res.samples_per_s,
        "by_learner": {str(k): v for k, v in res.ledger.by_learner.items()},
        "push_staleness_max": max(pushes, default=0.0),
        "ledger_ok": res.ledger.ok,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, nargs="+", default=[1, 2])
    p.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    p.add_argument("--budget", type=float, default=150.0, help="seconds per run")
    p.add_argument("--quick", action="store_true", help="a smoke run: writes *_quick.json")
    args = p.parse_args()
    rows = []
    for seed in args.seeds:
        for mode in args.modes:
            res = train(_config(mode, seed, args.budget))
            rows.append(_row(mode, seed, res))
            r = rows[-1]
            t90 = "-" if r["t_to_0.9_s"] is None else f"{r['t_to_0.9_s']:.1f} s"
            print(f"seed {seed} {mode:<12} steps {r['steps']:>4} to 0.9 {t90:>8} final "
                  f"{r['final_accuracy']:.3f} {r['samples_per_s']:.0f}/s", flush=True)  # fmt: skip
    setup = {"seeds": args.seeds, "budget_s": args.budget, "mode": "fully-async",
             "max_staleness": 4, "task": "digits"}  # fmt: skip
    path = write_json("rl_learners_quick" if args.quick else "rl_learners", RlLearners,
                      {"setup": setup, "rows": rows})  # fmt: skip
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
