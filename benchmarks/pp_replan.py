"""Re-planning under a straggler that starts mid-run: the static cut against the re-planned one.

The model is ``--layers`` equal blocks (``nn.Linear`` + ``nn.GELU``) and a head, ZB-H1 with
8 microbatches on ``--ranks`` gloo ranks. From step ``--start`` on, rank 1 really runs
``--factors`` times slower (``StragglerObserver(Straggler(...))``: it sleeps in proportion
to each op). Two runs alternate, ``--rounds`` times each: the runner with a ``Replanner``
hook with ``replan=False`` (the static cut, the baseline) and with re-planning on; the run is
:func:`nobubble.bench.pp_replan.run_replan`, which ``nobubble demo`` shows too.

Per run: the median step before the straggler (steps 3 to start-1), after it (the last
``(steps - start) // 2`` steps), the step at which the cut changed and what the switch cost
(``replan_ms``). The static run's slow-down is the loss; the share of it the re-planned run
wins back is given on step time, ``(static_after - replanned_after) / (static_after -
before)``, and on throughput (the same with 1 / step time), where ``before`` pools both
runs' steps before the straggler (the same configuration then), per round, median over
rounds. JSON: ``benchmarks/results/pp_replan.json``; ``--plot`` draws the step times.

    .venv/bin/python -m benchmarks.pp_replan [--ranks 2] [--factors 1.5 2] [--rounds 5] [--quick]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

from benchmarks._common import write_json
from benchmarks.records.pp_replan import PpReplan
from nobubble.bench.output import print_table
from nobubble.bench.pp_replan import ReplanSetup, run_replan

ROOT = Path(__file__).resolve().parents[1]


def _summary(run: dict, start: int, steps: int) -> dict:
    ms = run["step_ms"]
    return {"before_ms": statistics.median(ms[3:start]),
            "after_ms": statistics.median(ms[steps - (steps - start) // 2:])}  # fmt: skip


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:.0%}"


def _rounds(a: argparse.Namespace, args: dict) -> list[dict]:
    """Alternate the static and the re-planned run ``a.rounds`` times at ``args['factor']``."""
    rounds = []
    for k in range(a.rounds):
        pair = {}
        for replan in (False, True) if k % 2 == 0 else (True, False):
            res = run_replan(ReplanSetup(num_ranks=a.ranks, replan=replan, **args)).to_dict()
            pair["replanned" if replan else "static"] = res | _summary(res, a.start, a.steps)
        # before the straggler both runs are the same configuration: their pooled median
        pooled = pair["static"]["step_ms"][3 : a.start] + pair["replanned"]["step_ms"][3 : a.start]
        pair["before_ms"] = statistics.median(pooled)
        before, static = pair["before_ms"], pair["static"]["after_ms"]
        moved = pair["replanned"]["after_ms"]
        slowed = static > before  # else the straggler cost nothing to win back
        pair["recovered_step_time"] = (static - moved) / (static - before) if slowed else None
        pair["recovered_throughput"] = (
            (1 / moved - 1 / static) / (1 / before - 1 / static) if slowed else None)  # fmt: skip
        first = [s for s in pair["replanned"]["replanned_at"] if s >= a.start]
        pair["replan_delay_steps"] = first[0] - a.start + 1 if first else None
        rounds.append(pair)
        print(f"factor {args['factor']:g} round {k}: recovered "
              f"{_pct(pair['recovered_step_time'])} of the step-time loss, "
              f"{_pct(pair['recovered_throughput'])} of the throughput loss; re-planned "
              f"{pair['replan_delay_steps']} step(s) after the straggler began",
              file=sys.stderr)  # fmt: skip
    return rounds


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--layers", type=int, default=40)
    ap.add_argument("--width", type=int, default=256)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--start", type=int, default=12, help="the straggler's first step")
    ap.add_argument("--factors", type=float, nargs="+", default=[1.5, 2.0],
                    help="the straggler's slow-down factors, one set of rounds each")  # fmt: skip
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument(
        "--plot",
        type=lambda s: Path(s) if s else None,
        default=ROOT / "docs" / "img" / "pp_replan.png",
        help="PNG ('': none)",
    )
    ap.add_argument("--quick", action="store_true", help="a short smoke run, nothing written")
    a = ap.parse_args(argv)
    if a.quick:
        a.steps, a.start, a.rounds, a.layers, a.factors = 10, 4, 1, 8, a.factors[:1]
    runs = []
    for factor in a.factors:
        args = {k: getattr(a, k) for k in ("layers", "width", "batch", "steps", "start")}
        args["factor"] = factor
        rounds = _rounds(a, args)
        run = {**args, "rounds": rounds}
        for key in ("recovered_step_time", "recovered_throughput"):
            known = [r[key] for r in rounds if r[key] is not None]
            run[f"{key}_median"] = statistics.median(known) if known else None
        runs.append(run)
        rows = [[k, f"{r['before_ms']:.0f}", f"{r['static']['after_ms']:.0f}",
                 f"{r['replanned']['after_ms']:.0f}", _pct(r["recovered_step_time"]),
                 _pct(r["recovered_throughput"]), r["replan_delay_steps"],
                 r["replanned"]["sizes"][-1]] for k, r in enumerate(rounds)]  # fmt: skip
        print_table(f"static cut vs re-planned, rank 1 {factor:g}x slow from step {a.start}",
                    ["round", "before ms", "static after ms", "re-planned after ms",
                     "recovered (step time)", "recovered (throughput)",
                     "re-plan after (steps)", "final cut"], rows)  # fmt: skip
    record = {"ranks": a.ranks, "schedule": "zb-h1", "runs": runs}
    if not a.quick:
        print(f"wrote {write_json('pp_replan', PpReplan, record)}")
        if a.plot:
            _plot(record, a.plot)
            print(f"wrote {a.plot}")
    return 0


def _plot(record: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = record["runs"]
    fig, axes = plt.subplots(1, len(runs), figsize=(6 * len(runs), 3.6), squeeze=False)
    for ax, run in zip(axes[0], runs, strict=True):
        for name, color in (("static", "tab:red"), ("replanned", "tab:blue")):
            per_step = list(zip(*(r[name]["step_ms"] for r in run["rounds"]), strict=True))
            ax.plot([statistics.median(s) for s in per_step], color=color, marker=".",
                    label="static cut" if name == "static" else "re-planned")  # fmt: skip
        for r in run["rounds"]:
            for s in r["replanned"]["replanned_at"]:
                ax.axvline(s + 0.5, color="tab:blue", alpha=0.3, linestyle=":")
        ax.axvline(run["start"] - 0.5, color="grey", linestyle="--", label="straggler starts")
        ax.set_xlabel("step")
        ax.set_ylabel("step time (ms), median of rounds")
        ax.set_title(f"rank 1 {run['factor']:g}x slow from step {run['start']}: "
                     f"{_pct(run['recovered_step_time_median'])} of the step-time loss "
                     "recovered", fontsize=10)  # fmt: skip
        ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    raise SystemExit(main())
