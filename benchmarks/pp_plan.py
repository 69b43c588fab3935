"""The planner against every cut, the naive default and torch's runtime, measured in one run.

For each model of ``examples/plan_models.py`` (torch's transformer, a Hugging Face Llama from
a config, an MLP of uneven layers) on 2 gloo ranks (one core each):

1. this process measures the runtime's own costs on 2 ranks (per action, per byte moved:
   :func:`~nobubble.pipeline.runtime.planning.measure_runtime`), profiles each block once
   and plans (:func:`nobubble.pipeline.runtime.planning.plan`, 8 microbatches): the cut, the
   schedule, recompute;
2. two ranks build every configuration once - the plan; every contiguous cut x {1F1B,
   ZB-H1, ZB-2p built from the measured costs} (the exhaustive search, which also holds the
   naive default ``split_model(model, 2)`` + 1F1B and ``balance="params"`` + 1F1B); the plan
   run by torch's runtime (:func:`~nobubble.pipeline.to_torch`); a plan made under a memory
   limit below the plan's peak - and time one step of each in turn, ``--rounds`` rounds of
   ``--steps`` steps, the order rotated every round;
3. each configuration's median step time is set beside its predicted one (the planner's
   simulation of the same cut and schedule from the same profile), its measured peak
   activation bytes beside the predicted peak.

Also: the plan on the transformer with one layer made 3x wider (its cut must move). The
report gives the plan's step over the exhaustive best and over the naive default; JSON in
``benchmarks/results/pp_plan.json``, the docs' table from it. CPU times on a shared machine:
read the ratios and medians.

    .venv/bin/python -m benchmarks.pp_plan [--rounds 5] [--steps 2] [--quick]
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import replace

from benchmarks._common import write_json
from benchmarks.records.pp_plan import PpPlan
from examples import plan_models
from nobubble.bench.output import print_table
from nobubble.distributed import spawn
from nobubble.pipeline import PipelineRunner, split_model, to_torch
from nobubble.pipeline.plan import Plan, plan_from_costs, sizes_from_cuts
from nobubble.pipeline.runtime.planning import RuntimeCosts, plan_model

MODELS = ("transformer", "llama", "uneven")
NAMED = ("1f1b", "zb-h1", "zb-2p")
MICROBATCHES = 8


def configurations(p: Plan, blocks, mem_plan: Plan) -> list[dict]:
    """Every configuration to run: label(s), cut, schedule name, recompute, predictions."""
    n = p.num_blocks
    naive = tuple(len(s) for s in split_model(blocks, 2))
    params = tuple(len(s) for s in split_model(blocks, 2, balance="params"))
    rows: dict[tuple, dict] = {}

    def add(label: str, owner: Plan, cand) -> None:
        key = (cand.cuts, cand.schedule, cand.recompute[0], cand.num_microbatches)
        row = rows.setdefault(key, {
            "labels": [], "cuts": list(cand.cuts), "sizes": list(sizes_from_cuts(cand.cuts, n)),
            "schedule": cand.schedule, "recompute": cand.recompute[0],
            "num_microbatches": cand.num_microbatches,
            "predicted_step_ms": cand.predicted_step_ms,
            "predicted_peak_bytes": list(cand.predicted_peak_bytes),
            "plan_json": owner.to_json(), "candidate": cand, "torch": False,
        })  # fmt: skip
        row["labels"].append(label)

    add("plan", p, p.chosen)
    for cut in range(1, n):
        for name in NAMED:
            cand = p.weigh((cut,), name)
            add(f"cut {cut}:{n - cut} {name}", p, cand)
    for label, sizes in (("naive (split_model) 1f1b", naive), ("params 1f1b", params)):
        add(label, p, p.weigh(tuple(sizes[:1]), "1f1b"))
    add("memory-limited plan", mem_plan, mem_plan.chosen)
    for row in rows.values():
        if "plan" in row["labels"]:
            row["torch"] = True  # torch's runtime executes the plan too
    return list(rows.values())


def own_stages(blocks, p: Plan, own: set[int]) -> list:
    """``blocks`` cut as ``p`` chose, None for the stages another rank runs."""
    return [s if k in own else None
            for k, s in enumerate(split_model(blocks, p.num_stages, balance=p))]  # fmt: skip


def rank_main(ctx, model: str, configs: list[dict], rounds: int, steps: int) -> dict:
    import torch.distributed as dist

    factory = getattr(plan_models, model)
    _, x, y, loss_fn = factory()
    runs = []  # (config index, path, step function, runner or None, own modules)
    for i, c in enumerate(configs):
        as_chosen = replace(Plan.from_json(c["plan_json"]), chosen=c["candidate"])
        sched = as_chosen.schedule()
        own = set(sched.stages_of(ctx.rank))
        stages = own_stages(factory()[0], as_chosen, own)  # a fresh copy: a runner patches it
        runner = PipelineRunner(stages, sched, loss_fn, recompute=c["recompute"],
                                static_shapes=True, timeout_s=600)  # fmt: skip
        runs.append((i, "nobubble", runner.step, runner, stages))
        if c["torch"]:
            tstages = own_stages(factory()[0], as_chosen, own)
            runtime = to_torch(tstages, sched, loss_fn)
            last = sched.num_stages - 1

            def torch_step(xb, yb, runtime=runtime, own=own, last=last):
                kwargs = {"target": yb} if last in own else {}
                runtime.step(*((xb,) if 0 in own else ()), **kwargs)

            runs.append((i, "torch", torch_step, None, tstages))
    times: dict[tuple[int, str], list[float]] = {(i, path): [] for i, path, *_ in runs}
    peaks: dict[int, int] = {}

    def one(step_fn, stages) -> float:
        dist.barrier()
        t0 = time.perf_counter()
        step_fn(x, y)
        dist.barrier()
        elapsed = time.perf_counter() - t0
        for s in stages:
            if s is not None:
                s.zero_grad(set_to_none=True)
        return elapsed

    for _, _, step_fn, _, stages in runs:  # warm-up: shapes, allocator, first-call costs
        one(step_fn, stages)
    for r in range(rounds):
        shift = r % len(runs)
        order = runs[shift:] + runs[:shift]
        if r % 2:
            order.reverse()
        for i, path, step_fn, runner, stages in order:
            per_round = [one(step_fn, stages) for _ in range(steps)]
            times[(i, path)].append(statistics.median(per_round))
            if runner is not None:
                peaks[i] = max(peaks.get(i, 0), runner.peak_activation_bytes)
    for _, _, _, runner, _ in runs:
        if runner is not None:
            runner.close()
    return {"times": {f"{i}|{path}": t for (i, path), t in times.items()}, "peaks": peaks}


def bench_model(model: str, rounds: int, steps: int) -> dict:
    import torch

    torch.set_num_threads(1)  # as each rank runs
    blocks, x, y, loss_fn = getattr(plan_models, model)()
    t0 = time.perf_counter()
    p = plan_model(blocks, x, y, loss_fn, num_ranks=2, num_microbatches=MICROBATCHES)
    plan_s = time.perf_counter() - t0
    limit = 0.75 * max(p.predicted_peak_bytes)
    s = p.setting
    mem_plan = plan_from_costs(
        p.blocks, num_ranks=2, batch_size=s.batch_size, num_microbatches=MICROBATCHES,
        microbatch_size=s.microbatch_size, memory_limit=limit, input_bytes=s.input_bytes,
        op_overhead_ms=s.op_overhead_ms, comm_ms_per_byte=s.comm_ms_per_byte,
    )  # fmt: skip
    configs = configurations(p, blocks, mem_plan)
    print(f"{model}: {p.num_blocks} blocks, plan {p.stage_sizes()} {p.schedule_name} "
          f"(planned in {plan_s:.1f} s); running {len(configs)} configurations")  # fmt: skip
    per_rank = spawn(rank_main, 2, args=(model, configs, rounds, steps), timeout_s=3600)
    rows = []
    for i, c in enumerate(configs):
        c = {k: v for k, v in c.items() if k not in ("candidate", "plan_json")}
        per_round = per_rank[0]["times"][f"{i}|nobubble"]  # a step ends at a barrier
        c["measured_step_ms"] = 1e3 * statistics.median(per_round)
        c["rounds_ms"] = [1e3 * t for t in per_round]
        c["measured_over_predicted"] = c["measured_step_ms"] / c["predicted_step_ms"]
        c["measured_peak_bytes"] = [r["peaks"][i] for r in per_rank]
        if c.pop("torch"):
            c["torch_step_ms"] = 1e3 * statistics.median(per_rank[0]["times"][f"{i}|torch"])
        rows.append(c)
    exhaustive = [r for r in rows if any(lb.startswith("cut ") for lb in r["labels"])]
    best = min(exhaustive, key=lambda r: r["measured_step_ms"])
    plan_row = next(r for r in rows if "plan" in r["labels"])
    naive = next(r for r in rows if "naive (split_model) 1f1b" in r["labels"])
    mem_row = next(r for r in rows if "memory-limited plan" in r["labels"])
    return {
        "blocks": p.num_blocks, "block_total_ms": [b.total_ms for b in p.blocks],
        "plan_seconds": plan_s, "op_overhead_ms": p.setting.op_overhead_ms,
        "comm_ms_per_byte": p.setting.comm_ms_per_byte, "plan": {"sizes": list(p.stage_sizes()),
                                         "schedule": p.schedule_name},
        "rows": rows, "exhaustive_best": best["labels"][0],
        "plan_over_best": plan_row["measured_step_ms"] / best["measured_step_ms"],
        "naive_over_plan": naive["measured_step_ms"] / plan_row["measured_step_ms"],
        "memory_limit_bytes": limit,
        "memory_limited_fits": max(mem_row["measured_peak_bytes"]) <= limit,
    }  # fmt: skip


def wider_layer_moves_cut() -> dict:
    """The transformer planned as is and with one layer 3x wider (the runtime's costs
    measured once, for both): the two cuts."""
    import torch

    torch.set_num_threads(1)
    out: dict = {}
    costs = None  # measured with the first plan, reused for the second
    for label, kwargs in (("as is", {}), ("last layer 3x wider", {"wider": 3})):
        blocks, x, y, loss_fn = plan_models.transformer(**kwargs)
        p = plan_model(blocks, x, y, loss_fn, num_ranks=2, num_microbatches=MICROBATCHES,
                       schedules=NAMED, runtime=costs)  # fmt: skip
        costs = costs or RuntimeCosts(p.setting.op_overhead_ms, p.setting.comm_ms_per_byte)
        out[label] = {"sizes": list(p.stage_sizes()), "schedule": p.schedule_name}
    out["cut_moved"] = out["as is"]["sizes"] != out["last layer 3x wider"]["sizes"]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5, help="alternating rounds (medians)")
    ap.add_argument("--steps", type=int, default=2, help="timed steps per configuration a round")
    ap.add_argument("--models", default=",".join(MODELS), help="comma-separated subset")
    ap.add_argument("--quick", action="store_true", help="2 rounds of 1 step (a smoke run)")
    args = ap.parse_args()
    rounds, steps = (2, 1) if args.quick else (args.rounds, args.steps)
    models = args.models.split(",")
    unknown = [m for m in models if m not in MODELS]
    if unknown or rounds < 1 or steps < 1:
        ap.error(f"models {unknown} unknown (choose from {MODELS}), or rounds/steps < 1")
    results = {m: bench_model(m, rounds, steps) for m in models}
    wider = wider_layer_moves_cut()
    import torch

    path = write_json("pp_plan" + ("_quick" if args.quick else ""), PpPlan, {
        "ranks": 2, "microbatches": MICROBATCHES, "rounds": rounds, "steps": steps,
        "quick": args.quick, "torch": torch.__version__, "models": results, "wider": wider,
    })  # fmt: skip
    for m, res in results.items():
        print_table(f"{m}: measured vs predicted (ms), 2 ranks, m={MICROBATCHES}",
                    ["configuration", "sizes", "schedule", "measured", "predicted", "meas/pred",
                     "peak MiB (rank max)"],
                    [[", ".join(r["labels"]), r["sizes"], r["schedule"],
                      f"{r['measured_step_ms']:.0f}", f"{r['predicted_step_ms']:.0f}",
                      f"{r['measured_over_predicted']:.2f}",
                      f"{max(r['measured_peak_bytes']) / 2**20:.1f}"]
                     for r in sorted(res["rows"], key=lambda r: r["measured_step_ms"])])  # fmt: skip
        print(f"  plan / exhaustive best ({res['exhaustive_best']}): {res['plan_over_best']:.3f};"
              f" naive / plan: {res['naive_over_plan']:.3f}; memory-limited plan fits: "
              f"{res['memory_limited_fits']}")  # fmt: skip
    print(
        f"one layer 3x wider: cut {wider['as is']['sizes']} -> "
        f"{wider['last layer 3x wider']['sizes']} (moved: {wider['cut_moved']})"
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
