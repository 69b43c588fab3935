"""Pipeline runtime benchmark: measured zero-bubble speedups vs the simulator's prediction.

1. B/W split cost on one GPT stage (this process, 1 thread): T_B + T_W against the fused
   autograd backward, for our deferred-linear split and for torch's
   ``stage_backward_input`` / ``stage_backward_weight`` (graph split); and the bytes each
   holds between B and W.
2. Profile the 2-stage GPT (per-stage T_F, T_B, T_W, memory; T_comm over 2 gloo ranks) and
   simulate 1f1b, zb-h1, zb-2p with those costs: the predicted speedups.
3. Train with the three schedules on 2 local ranks, 1 thread each, in one spawn; the
   schedules take turns (``--rounds``) so load bursts on a shared machine hit all alike.
   Median step time (barrier to barrier, first step of each turn dropped) and median
   makespan (first op start to last op end); measured speedup vs 1f1b (ratio of medians,
   and paired: the median over rounds of the ratio within a round) next to the predicted
   one, and measured peak activation memory per rank next to the simulated one.

Writes benchmarks/results/pp_runtime.json (or pp_runtime_quick.json).

    python -m benchmarks.pp_runtime [--quick]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from dataclasses import asdict

import torch

from benchmarks._common import write_json
from benchmarks.records.pp_runtime import PpRuntime
from nobubble.bench.output import print_table
from nobubble.distributed import spawn
from nobubble.pipeline.plan_inputs import MiB
from nobubble.pipeline.runtime.executor import TrainConfig, boundary_shapes
from nobubble.pipeline.runtime.launch import LaunchOptions, run_local
from nobubble.pipeline.runtime.models import GPTConfig, build_blocks, partition_blocks
from nobubble.pipeline.runtime.profile import Profile, comm_probe, profile_stages
from nobubble.pipeline.runtime.report import measured_bubble
from nobubble.pipeline.schedules import get_schedule
from nobubble.pipeline.simulate import simulate

SCHEDULES = ("1f1b", "zb-h1", "zb-2p")


def torch_split_cost(model: GPTConfig, blocks_range: range, x_shape, repeats: int) -> dict:
    """torch.distributed.pipelining's graph split on the same stage: times (ms) and bytes
    held between B and W (the retained graph's saved tensors + the stashed grads)."""
    from torch.distributed.pipelining._backward import (
        stage_backward_input,
        stage_backward_weight,
    )

    blocks = build_blocks(model, blocks_range)
    gen = torch.Generator().manual_seed(3)
    x0 = torch.randn(x_shape, generator=gen)
    dy = torch.randn(x_shape, generator=gen)
    params = {p.untyped_storage().data_ptr() for p in blocks.parameters()}
    tb, tw, tf, held, saved = [], [], [], 0, 0
    for rep in range(repeats + 1):
        x = x0.clone().requires_grad_(True)
        y = x
        for b in blocks.values():
            y = b(y)
        t0 = time.thread_time()
        y.backward(dy)  # the fused baseline on the same blocks
        tf.append((time.thread_time() - t0) * 1e3)
        blocks.zero_grad(set_to_none=True)
        x = x0.clone().requires_grad_(True)
        seen: dict[int, int] = {}  # the distinct storages autograd saves (parameters excluded)

        def pack(t: torch.Tensor, seen: dict[int, int] = seen) -> torch.Tensor:
            if t.untyped_storage().data_ptr() not in params:
                seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            y = x
            for b in blocks.values():
                y = b(y)
        saved = sum(seen.values())
        t0 = time.thread_time()
        _, groups = stage_backward_input([y], [dy], [x], blocks.parameters())
        t1 = time.thread_time()
        stash = {id(g): g.untyped_storage().nbytes() for pg in groups for gs in pg["grads"]
                 for g in gs if g is not None}  # fmt: skip
        stage_backward_weight(blocks.parameters(), groups)
        t2 = time.thread_time()
        blocks.zero_grad(set_to_none=True)
        if rep:
            tb.append((t1 - t0) * 1e3)
            tw.append((t2 - t1) * 1e3)
            held = saved + sum(stash.values())
    return {
        "t_b": statistics.median(tb), "t_w": statistics.median(tw),
        "fused": statistics.median(tf[1:]), "held_bytes": held, "saved_bytes": saved,
        "ratio": statistics.median((b + w) / f for b, w, f in zip(tb, tw, tf[1:], strict=True)),
    }  # fmt: skip


def split_table(model: GPTConfig, prof: Profile, repeats: int) -> list[dict]:
    ranges = partition_blocks(model, 2)
    shapes = boundary_shapes(model, ranges, prof.microbatch_size)
    rows = [
        {"stage": f"stage {st.stage} (blocks {st.blocks[0]}-{st.blocks[-1]})",
         "method": "deferred linear (ours)", "t_b": st.t_b, "t_w": st.t_w,
         "fused": st.t_bw_fused, "ratio": st.bw_ratio, "held_mib": st.mem_w / MiB,
         "forward_saved_mib": st.mem_f / MiB}
        for st in prof.stages
    ]  # fmt: skip
    # torch's split on stage 0's transformer blocks (input: an activation, not tokens)
    blocks = range(1, ranges[0].stop)
    tc = torch_split_cost(model, blocks, shapes[1], repeats)
    rows.append(
        {"stage": f"blocks {blocks[0]}-{blocks[-1]}", "method": "torch stage_backward_input/weight",
         "t_b": tc["t_b"], "t_w": tc["t_w"], "fused": tc["fused"], "ratio": tc["ratio"],
         "held_mib": tc["held_bytes"] / MiB, "forward_saved_mib": tc["saved_bytes"] / MiB}
    )  # fmt: skip
    return rows


def run_schedules(model, schedules, mb_size, steps, rounds, timeout_s):
    configs = []
    for _ in range(rounds):
        for sched in schedules:
            configs.append(
                TrainConfig(
                    model=model, schedule=sched, microbatch_size=mb_size, num_steps=steps, lr=1e-3
                )  # fmt: skip
            )
    results = run_local(configs, LaunchOptions(timeout_s=timeout_s, threads_per_rank=1))
    out = {n: {"step": [], "makespan": [], "bubble": [], "peak": None, "turns": []}
           for n in SCHEDULES}  # fmt: skip
    for cfg, per_rank in zip(configs, results, strict=True):
        o = out[cfg.schedule.name]
        turn = [max(r.step_times_s[s] for r in per_rank) for s in range(1, steps)]
        o["turns"].append(statistics.median(turn))  # median step of this turn
        for s in range(1, steps):  # the first step of each turn warms up
            o["step"].append(max(r.step_times_s[s] for r in per_rank))
            makespan, bubble = measured_bubble(per_rank, s)
            o["makespan"].append(makespan)
            o["bubble"].append(bubble)
        o["peak"] = [r.peak_activation_bytes for r in per_rank]
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="smaller model, fewer steps")
    ap.add_argument("--rounds", type=int, default=None)
    args = ap.parse_args()
    torch.set_num_threads(1)
    if args.quick:
        model = GPTConfig(vocab_size=256, seq_len=64, hidden=128, num_heads=4, num_layers=4)
        num_mb, mb_size, steps, rounds, repeats = 6, 4, 4, args.rounds or 2, 3
    else:
        model = GPTConfig(vocab_size=256, seq_len=128, hidden=256, num_heads=4, num_layers=4)
        num_mb, mb_size, steps, rounds, repeats = 8, 4, 3, args.rounds or 4, 5
    ranges = partition_blocks(model, 2)
    shapes = boundary_shapes(model, ranges, mb_size)
    t_comm = spawn(comm_probe, 2, args=(tuple(shapes[1]),), timeout_s=300)[0]
    # thread CPU time: what the ops cost, not how long other processes kept them waiting
    prof = profile_stages(
        model, 2, microbatch_size=mb_size, repeats=repeats, t_comm=t_comm, clock="cpu"
    )
    split = split_table(model, prof, repeats)
    costs = prof.cost_model()
    # the automatic schedules (zb-2p) are built for the profiled costs; the run uses the same
    schedules = [get_schedule(n, num_ranks=2, num_microbatches=num_mb, costs=costs)
                 for n in SCHEDULES]  # fmt: skip
    sims = {s.name: simulate(s, costs) for s in schedules}
    load_before = os.getloadavg()[0]
    measured = run_schedules(model, schedules, mb_size, steps, rounds, timeout_s=1800)
    load = (load_before, os.getloadavg()[0])

    rows, table = [], []
    base = statistics.median(measured["1f1b"]["step"])
    base_ms = statistics.median(measured["1f1b"]["makespan"])
    for n in SCHEDULES:
        m, sim = measured[n], sims[n]
        step, ms = statistics.median(m["step"]), statistics.median(m["makespan"])
        pred = sims["1f1b"].makespan / sim.makespan
        # paired: 1f1b and this schedule in the same round of turns, median over rounds
        paired = statistics.median(
            a / b for a, b in zip(measured["1f1b"]["turns"], m["turns"], strict=True)
        )
        row = {
            "schedule": n, "steps_measured": len(m["step"]),
            "median_step_s": step, "median_makespan_s": ms,
            "measured_speedup_step": base / step, "measured_speedup_makespan": base_ms / ms,
            "predicted_makespan_s": sim.makespan / 1e3, "predicted_speedup": pred,
            "speedup_error": (base / step) / pred - 1,
            "paired_speedup": paired, "paired_speedup_error": paired / pred - 1,
            "measured_bubble": statistics.median(m["bubble"]), "predicted_bubble": sim.bubble_rate,
            "peak_activation_mib": [b / MiB for b in m["peak"]],
            "predicted_peak_mib": [b / MiB for b in sim.peak_memory],
        }  # fmt: skip
        rows.append(row)
        table.append([
            n, step * 1e3, sim.makespan, f"{base / step:.3f}", f"{paired:.3f}", f"{pred:.3f}",
            f"{row['speedup_error']:+.1%}", f"{row['paired_speedup_error']:+.1%}",
            f"{row['measured_bubble']:.1%}",
            f"{sim.bubble_rate:.1%}",
            " / ".join(f"{b:.1f}" for b in row["peak_activation_mib"]),
            " / ".join(f"{b:.1f}" for b in row["predicted_peak_mib"]),
        ])  # fmt: skip
    print_table(
        f"B/W split on the GPT stage (ms, MiB; hidden {model.hidden}, seq {model.seq_len}, "
        f"mb {mb_size})",
        ["stage", "method", "T_B", "T_W", "T_B+T_W", "fused BW", "ratio", "held B->W MiB"],
        [[r["stage"], r["method"], r["t_b"], r["t_w"], r["t_b"] + r["t_w"], r["fused"],
          f"{r['ratio']:.3f}", r["held_mib"]] for r in split],
        caption="thread CPU time, medians; ratio = median of per-repeat (T_B+T_W)/fused",
    )  # fmt: skip
    print_table(
        f"2 ranks x 1 thread, GPT {model.num_layers} layers h={model.hidden} T={model.seq_len}, "
        f"M={num_mb}, mb={mb_size}",
        ["schedule", "step ms", "sim ms", "speedup", "paired", "sim speedup", "error",
         "paired error", "bubble", "sim bubble", "peak act MiB r0/r1", "sim peak MiB"],
        table,
        caption=f"T_comm {t_comm:.2f} ms; medians of {len(measured['1f1b']['step'])} steps "
        f"in {rounds} rounds of turns (paired: median over rounds of the in-round ratio); "
        f"load average during the run {load[0]:.1f} -> {load[1]:.1f} on {os.cpu_count()} CPUs",
    )  # fmt: skip
    name = "pp_runtime_quick" if args.quick else "pp_runtime"
    path = write_json(name, PpRuntime, {
        "model": asdict(model),
        "num_microbatches": num_mb, "microbatch_size": mb_size, "ranks": 2,
        "threads_per_rank": 1, "load_average": load, "cpus": os.cpu_count(), "profile": prof.to_dict(), "bw_split": split, "schedules": rows,
    })  # fmt: skip
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
