"""``nobubble demo`` RL step: the same GRPO run synchronously and fully asynchronously.

Both runs train the digit-completion policy for the same number of steps on the local
engine (generator and trainer in their own processes). The table shows what asynchrony
buys (samples/s, idle ratios) and what it costs (staleness); the PNG shows accuracy against
wall-clock and step, the traces show each stage's busy and idle time.
"""

from __future__ import annotations

from pathlib import Path

from nobubble.cli.util import console, print_table


def run(out_dir: Path, quick: bool) -> list[Path]:
    from nobubble.rl import RunConfig, train
    from nobubble.rl.system.result import SUMMARY_COLUMNS, plot_runs, summary_row, write_trace

    steps = 15 if quick else 200
    con = console()
    results = {}
    for mode, eta in (("sync", None), ("fully-async", 4)):
        con.print(f"RL: {mode} GRPO on digit completion, {steps} steps ...")
        results[mode] = train(
            RunConfig(mode=mode, max_staleness=eta, steps=steps, eval_every=max(1, steps // 6))
        )
    base = results["sync"].samples_per_s
    print_table(
        f"sync vs fully-async (max_staleness=4), {steps} steps each",
        [*SUMMARY_COLUMNS, "speed"],
        [summary_row(k, r) + [f"{r.samples_per_s / base:.2f}x"] for k, r in results.items()],
    )
    out = out_dir / "rl"
    paths = [plot_runs(results, out / "rl_sync_vs_async.png", title="sync vs fully-async")]
    for mode, r in results.items():
        paths.append(write_trace(r, out / f"rl_{mode}_trace.json"))
    return paths
