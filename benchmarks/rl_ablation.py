"""The lag-fix ablation, stored: ``nobubble rl compare --ablation`` run as a user runs it.

Each fix of the ablation alone (drop > K, age weights, KL to a reference, replay uniform and
prioritized, decoupled PPO, V-trace), naive PPO, and all of them together (the aggressive
preset), at max staleness 8 and 16, fully-async on digits with the trainer slowed by 0.3 s
per step (one group per generation call, so the generator runs ahead to the bound). The
command itself runs (``--json``); this script keeps one row per run and the accuracy curves,
in ``benchmarks/results/rl_ablation.json``, and copies the command's plots to ``docs/img``.

    python -m benchmarks.rl_ablation                  # 150 steps per run, about 20 minutes here
    python -m benchmarks.rl_ablation --steps 20 --etas 8 --quick
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks._common import write_json
from benchmarks.records.rl_ablation import RlAblation

IMG = Path(__file__).resolve().parents[1] / "docs" / "img"


def _row(key: str, run: dict) -> dict:
    eta, fix = key.split(":", 1)
    curve = [(round(p["wall_s"], 2), p["accuracy"]) for p in run["curve"]]
    t90 = next((t for t, acc in curve if acc >= 0.9), None)
    return {
        "fix": fix,
        "eta": int(eta.removeprefix("eta")),
        "steps": run["steps"],
        "wall_s": run["wall_s"],
        "final_accuracy": run["outcome"]["final_accuracy"],
        "best_accuracy": max((acc for _, acc in curve), default=0.0),
        "t_to_0.9_s": t90,
        "samples_per_s": run["samples_per_s"],
        "dropped_stale": run["ledger"]["dropped"].get("stale", 0),
        "reused": run["ledger"]["reused"],
        "staleness_max": run["staleness_max"],
        "ledger_ok": run["ledger"]["ok"],
        "curve": curve,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=150, help="trainer steps per run")
    p.add_argument("--etas", default="8,16", help="max staleness values, comma-separated")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quick", action="store_true", help="a smoke run: writes *_quick.json")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        argv = [sys.executable, "-m", "nobubble", "rl", "compare", "--ablation", "--json",
                "--steps", str(args.steps), "--etas", args.etas, "--seed", str(args.seed),
                "--out", str(Path(tmp) / "out")]  # fmt: skip
        print(" ".join(argv[1:]), flush=True)
        done = subprocess.run(argv, capture_output=True, text=True, timeout=7200)
        if done.returncode != 0:
            raise SystemExit(f"the ablation failed (exit {done.returncode}): {done.stderr}")
        report = json.loads(done.stdout)
        if not args.quick:
            for name, png in report["artifacts"].items():
                shutil.copy(png, IMG / f"rl_ablation_{name.removeprefix('plot:')}.png")
    rows = [_row(k, r) for k, r in report["runs"].items()]
    for r in rows:
        t90 = "-" if r["t_to_0.9_s"] is None else f"{r['t_to_0.9_s']:.0f} s"
        print(f"eta {r['eta']:>2} {r['fix']:<20} final {r['final_accuracy']:.3f} "
              f"best {r['best_accuracy']:.3f} to 0.9 {t90:>6} {r['samples_per_s']:.0f}/s")  # fmt: skip
    setup = {"steps": args.steps, "etas": args.etas, "seed": args.seed, "trainer_delay_s": 0.3,
             "task": "digits", "mode": "fully-async"}  # fmt: skip
    path = write_json("rl_ablation_quick" if args.quick else "rl_ablation", RlAblation,
                      {"setup": setup, "rows": rows})  # fmt: skip
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
