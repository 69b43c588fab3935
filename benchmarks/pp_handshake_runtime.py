"""Handshake vs static dispatch at run time, with a real straggler, against the simulator.

A small GPT (the built-in ``GPTConfig``) on gloo ranks (one thread each), the zb-h1 plan,
rank ``--straggler`` really slowed (its ops sleep ``factor - 1`` times their compute time).
In one spawn the two policies take turns (``--rounds``; static, handshake, static, ...), so
load bursts on a shared machine hit both alike; each turn runs ``--steps`` steps and its
first is dropped. Per policy:

- measured: the median makespan of a step (first op start to last op end over the ranks)
  and the median step time (barrier to barrier, optimizer included); the paired ratio is the
  median over rounds of handshake / static within a round;
- simulated: ``simulate_dispatch(plan, costs, policy=...)`` with costs from the run's own op
  times (mean per op and stage over the policy's kept steps, the straggler's slowdown
  inside them; ``costs_from_op_times``) and T_comm from a ping-pong probe; and the static
  replay of the order the runtime really ran in its last step (``replay_ms``).

Writes benchmarks/results/pp_handshake_runtime.json.

    python -m benchmarks.pp_handshake_runtime [--ranks 2 4] [--rounds 5] [--quick]
"""

from __future__ import annotations

import argparse
import statistics

from benchmarks._common import write_json
from benchmarks.records.pp_handshake_runtime import PpHandshakeRuntime
from nobubble.bench.output import print_table
from nobubble.distributed import spawn
from nobubble.pipeline.actions import Action, Op, Schedule
from nobubble.pipeline.dispatch import parse_straggler, simulate_dispatch
from nobubble.pipeline.runtime.executor import WAIT, TrainConfig, boundary_shapes
from nobubble.pipeline.runtime.launch import LaunchOptions, run_local
from nobubble.pipeline.runtime.models import GPTConfig, partition_blocks
from nobubble.pipeline.runtime.profile import comm_probe, costs_from_op_times
from nobubble.pipeline.runtime.report import measured_bubble
from nobubble.pipeline.schedules import get_schedule
from nobubble.pipeline.validate import validate

POLICIES = ("static", "handshake")


def _op_events(results, steps):
    for r in results:
        for e in r.events:
            if e.cat != WAIT and e.args.get("step") in steps:
                yield e


def op_means(runs, steps) -> dict[tuple[str, int], float]:
    """``(op, stage) -> mean ms`` over every kept step of every run of one policy. The mean,
    not the median: on a shared machine op times have a long right tail, and a step's
    makespan sums them, so medians predict steps that are too short."""
    times: dict[tuple[str, int], list[float]] = {}
    for results in runs:
        for e in _op_events(results, steps):
            times.setdefault((e.cat, e.args["stage"]), []).append(e.dur_us / 1e3)
    return {k: statistics.fmean(v) for k, v in times.items()}


def executed_order(results, plan: Schedule, step: int) -> Schedule:
    """The order each rank really ran in ``step`` (its op events sorted by start)."""
    rows = []
    for r in sorted(results, key=lambda r: r.rank):
        evs = sorted(_op_events([r], {step}), key=lambda e: e.start_us)
        rows.append(tuple(Action(e.args["stage"], Op(e.cat), e.args["microbatch"]) for e in evs))
    ran = Schedule(f"{plan.name}+ran", plan.num_microbatches, plan.stage_to_rank, tuple(rows))
    validate(ran)
    return ran


def run_pipeline(num_ranks: int, args, model: GPTConfig, t_comm: float) -> dict:
    plan = get_schedule("zb-h1", num_ranks=num_ranks, num_microbatches=args.microbatches)
    straggler = parse_straggler(args.straggler)
    configs = [
        TrainConfig(model=model, schedule=plan, microbatch_size=args.microbatch_size,
                    num_steps=args.steps, dispatch=policy, straggler=straggler)
        for _ in range(args.rounds) for policy in POLICIES
    ]  # fmt: skip
    options = LaunchOptions(device="cpu", timeout_s=300.0, threads_per_rank=1)
    all_results = run_local(configs, options)
    kept = set(range(1, args.steps))
    out: dict = {"num_ranks": num_ranks, "plan": plan.name, "straggler": args.straggler}
    per_round: dict[str, list[float]] = {p: [] for p in POLICIES}
    for policy in POLICIES:
        runs = [res for cfg, res in zip(configs, all_results, strict=True)
                if cfg.dispatch == policy]  # fmt: skip
        spans = [measured_bubble(res, s)[0] * 1e3 for res in runs for s in sorted(kept)]
        steps = [max(r.step_times_s[s] for r in res) * 1e3 for res in runs for s in sorted(kept)]
        per_round[policy] = [statistics.median(measured_bubble(res, s)[0] for s in kept)
                             for res in runs]  # fmt: skip
        costs = costs_from_op_times(op_means(runs, kept), plan.num_stages, t_comm=t_comm)
        sim = simulate_dispatch(plan, costs, policy=policy)
        replay = simulate_dispatch(executed_order(runs[-1], plan, args.steps - 1), costs)
        measured = statistics.median(spans)
        out[policy] = {
            "measured_makespan_ms": measured,
            "measured_step_time_ms": statistics.median(steps),
            "simulated_makespan_ms": sim.makespan,
            "replay_makespan_ms": replay.makespan,
            "measured_vs_simulated": measured / sim.makespan - 1,
            "simulated_bubble_rate": sim.bubble_rate,
            "deviations_simulated": sim.deviations,
            "op_ms": {f"{op}{stage}": round(ms, 3) for (op, stage), ms in
                      sorted(op_means(runs, kept).items(), key=lambda kv: (kv[0][1], kv[0][0]))},
        }  # fmt: skip
    ratios = [h / s for s, h in zip(per_round["static"], per_round["handshake"], strict=True)]
    out["paired_handshake_over_static"] = statistics.median(ratios)
    out["ratio_of_medians"] = (
        out["handshake"]["measured_makespan_ms"] / out["static"]["measured_makespan_ms"]
    )
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--microbatches", type=int, default=8)
    ap.add_argument("--microbatch-size", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=4, help="per turn; the first is dropped")
    ap.add_argument("--straggler", default="1:1.5")
    ap.add_argument("--quick", action="store_true", help="2 ranks, 2 rounds, 3 steps")
    args = ap.parse_args()
    if args.quick:
        args.ranks, args.rounds, args.steps = [2], 2, 3
    model = GPTConfig(vocab_size=256, seq_len=64, hidden=128, num_heads=4, num_layers=4)
    shape = boundary_shapes(model, partition_blocks(model, 2), 1)[1]
    t_comm = spawn(comm_probe, 2, args=((args.microbatch_size, *tuple(shape)[1:]),))[0]
    rows, out = [], []
    for num_ranks in args.ranks:
        res = run_pipeline(num_ranks, args, model, t_comm)
        out.append(res)
        for policy in POLICIES:
            r = res[policy]
            rows.append([num_ranks, policy, r["measured_makespan_ms"], r["simulated_makespan_ms"],
                         f"{r['measured_vs_simulated']:+.1%}", r["replay_makespan_ms"],
                         r["measured_step_time_ms"]])  # fmt: skip
        print(f"p={num_ranks}: handshake/static makespan, paired median "
              f"{res['paired_handshake_over_static']:.3f}")  # fmt: skip
    print_table(
        f"zb-h1, m={args.microbatches}, straggler {args.straggler}, gpt {model.hidden}x"
        f"{model.num_layers}, {args.rounds} rounds (ms)",
        ["p", "dispatch", "measured", "simulated", "meas/sim", "replay of order", "step time"],
        rows,
    )
    name = "pp_handshake_runtime" + ("_quick" if args.quick else "")
    path = write_json(name, PpHandshakeRuntime, {"model": model.__dict__ | {"name": model.name}, "t_comm_ms": t_comm,
                             "microbatches": args.microbatches, "rounds": args.rounds,
                             "steps_per_turn": args.steps, "runs": out})  # fmt: skip
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
