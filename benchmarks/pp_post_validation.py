"""The optimizer step's bubble: synchronous gradient clipping against post-validation.

The GPT of ``examples/train_gpt.py`` trains on 2 gloo ranks with ZB-H1 through
``PipelineRunner``, AdamW and global-norm clipping at two thresholds: one the gradients stay
under (the usual case after warm-up: the optimistic step stands) and one every step exceeds
(the worst case: every step is rolled back and redone).
After each ``runner.step`` a rank either waits for the all-reduce of the gradient norm and
then steps (``synchronous_step``), or steps at once while the all-reduce travels and
checks afterwards (``PostValidatedOptimizer.step`` + ``confirm``). The two alternate step
by step on two copies of the model; the report gives, per rank, the median time from the
end of ``runner.step`` to a confirmed step (the optimizer phase) and the step time.

    .venv/bin/python -m benchmarks.pp_post_validation [--steps 12] [--quick]
"""

from __future__ import annotations

import argparse
import statistics
import time

from benchmarks._common import write_json
from benchmarks.pp_runner_vs_torch import _batch
from benchmarks.records.pp_post_validation import PpPostValidation
from examples.train_gpt import gpt, loss_fn
from nobubble.bench.output import print_table
from nobubble.distributed import spawn
from nobubble.pipeline import PipelineRunner, get_schedule, split_model
from nobubble.pipeline.runtime.optim import (
    PostValidatedOptimizer,
    synchronous_step,
)

MAX_NORMS = (100.0, 0.1)  # rarely clips, always clips


def rank_main(ctx, steps: int, batch: int, max_norm: float) -> dict:
    import torch

    vocab, x, y = _batch(batch)
    sched = get_schedule("zb-h1", num_ranks=2, num_microbatches=4)
    paths = {}
    for name in ("sync", "post"):
        runner = PipelineRunner(split_model(gpt(vocab), 2), sched, loss_fn, static_shapes=True)
        params = [p for m in runner.stage_modules.values() for p in m.parameters()]
        opt = torch.optim.AdamW(params, lr=1e-3)
        post = PostValidatedOptimizer(opt, params, max_norm=max_norm) if name == "post" else None
        paths[name] = (runner, params, opt, post)
    times: dict[str, dict[str, list[float]]] = {n: {"opt": [], "step": []} for n in paths}
    actions: dict[str, list[str]] = {n: [] for n in paths}
    for i in range(steps + 2):
        for name in ("sync", "post") if i % 2 == 0 else ("post", "sync"):
            runner, params, opt, post = paths[name]
            torch.distributed.barrier()
            t0 = time.perf_counter()
            runner.step(x, y)
            t1 = time.perf_counter()
            if post is None:
                done = synchronous_step(opt, params, max_norm=max_norm)
            else:
                post.step()
                done = post.confirm()
            t2 = time.perf_counter()
            opt.zero_grad()
            if i >= 2:  # two warm-up rounds
                times[name]["opt"].append(t2 - t1)
                times[name]["step"].append(t2 - t0)
                actions[name].append(done.action)
    for runner, *_ in paths.values():
        runner.close()
    return {
        "rank": ctx.rank,
        "median_s": {n: {k: statistics.median(v) for k, v in t.items()} for n, t in times.items()},
        "actions": actions,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=12, help="timed steps per path")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--quick", action="store_true", help="3 steps, for a smoke run")
    args = ap.parse_args()
    steps = 3 if args.quick else args.steps
    rows = []
    for max_norm in MAX_NORMS:
        for res in spawn(rank_main, 2, args=(steps, args.batch, max_norm), timeout_s=1800):
            rows.append(_row(res, max_norm))
    if not args.quick:
        path = write_json("pp_post_validation", PpPostValidation, {"ranks": 2, "schedule": "zb-h1",
                                                 "batch": args.batch, "steps": steps,
                                                 "rows": rows})  # fmt: skip
        print(f"wrote {path}")
    print_table(
        f"optimizer step after runner.step, zb-h1 on 2 ranks, AdamW (median of {steps} steps)",
        ["max_norm", "rank", "sync opt ms", "post-validated opt ms", "sync step ms", "post step ms",
         "clipped"],
        [[r["max_norm"], r["rank"], 1e3 * r["sync_optimizer_s"], 1e3 * r["post_optimizer_s"],
          1e3 * r["sync_step_s"], 1e3 * r["post_step_s"], f"{r['clipped_steps']}/{r['steps']}"]
         for r in rows],
    )  # fmt: skip


def _row(res: dict, max_norm: float) -> dict:
    m = res["median_s"]
    return {
        "max_norm": max_norm, "rank": res["rank"],
        "sync_optimizer_s": m["sync"]["opt"], "post_optimizer_s": m["post"]["opt"],
        "sync_step_s": m["sync"]["step"], "post_step_s": m["post"]["step"],
        "clipped_steps": res["actions"]["post"].count("clipped"),
        "steps": len(res["actions"]["post"]),
    }  # fmt: skip


if __name__ == "__main__":
    main()
