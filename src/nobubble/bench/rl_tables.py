"""What ``nobubble rl train`` and ``rl compare`` show of their runs: the title, each run's
progress (a bar or a line per evaluation, on stderr), the curves' labels and the table or
JSON of the :class:`~nobubble.rl.system.result.RunResult` of each label, and the files that
draw them (curves, traces)."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from nobubble.bench.output import console, print_result, progress_bar
from nobubble.rl.system.config import RunConfig

__all__ = ["run_title", "run_progress", "curve_label", "draw_runs", "render_runs"]


def run_title(
    cfg: Any, labels: list[str], *, compare: bool, env: str | None, ablation: bool
) -> str:
    """The title of the runs ``labels`` whose first config is ``cfg`` (``env``: the id given)."""
    if compare:
        if env is not None:
            return f"{env}: {', '.join(labels)} on the same budget (seed {cfg.seed})"
        if ablation:
            return (f"ablation ({cfg.steps} steps, fully-async, trainer "
                    f"+{cfg.trainer.delay_s}s/step)")  # fmt: skip
        return f"{' vs '.join(labels)} (same steps)"
    if not isinstance(cfg, RunConfig):
        return f"{cfg.arch} on {env} ({cfg.actors} x {cfg.envs_per_actor} envs)"
    title = f"nobubble rl train: {cfg.task}, {cfg.mode}, {cfg.algo}, {cfg.engine}"
    if cfg.mode != "sync":
        title += f", max_staleness={cfg.effective_max_staleness}"
    return title + (f", learners={cfg.learners} {cfg.aggregation}" if cfg.learners > 1 else "")


def curve_label(label: str, r: Any) -> str:
    return label if r.env is None else f"{label} ({r.env_steps_per_s:,.0f} steps/s)"


def draw_runs(results: dict[str, Any], out: Path, stem: str, title: str,
              groups: dict[str, list[str]] | None = None) -> dict[str, str]:  # fmt: skip
    """Write the runs' files under ``out`` and return them by key: ``plot`` (or ``plot:<group>``
    per group of labels ``<group>:<label>``, e.g. an ablation's staleness bounds) of every
    run's curve, and ``trace:<label>``, the trace of each task run when not grouped."""
    from nobubble.rl.system.result import plot_runs, write_trace

    paths = {}
    for name, labels in (groups or {"": list(results)}).items():
        png = out / f"{stem}{'_' + name if name else ''}.png"
        curves = {curve_label(k.removeprefix(f"{name}:"), results[k]): results[k] for k in labels}
        paths[f"plot:{name}" if name else "plot"] = str(plot_runs(curves, png, title=title))
    for label, r in results.items():
        if r.env is None and not groups:
            paths[f"trace:{label}"] = str(write_trace(r, out / f"{stem}_{label}_trace.json"))
    return paths


def run_progress(cfg: Any, label: str, quiet: bool,
                 bar: ExitStack) -> Callable[[int, dict[str, float]], None]:  # fmt: skip
    """The ``on_step`` of a run: a task run's progress bar (on a terminal; entered on
    ``bar``), an env run's line per evaluation on stderr."""
    if not isinstance(cfg, RunConfig):
        from nobubble.rl.actor_learner.model import env_label

        _line(f"training {cfg.arch} on {env_label(cfg.env)} ...")
        return _env_progress
    progress, task = bar.enter_context(progress_bar(
        label, total=cfg.steps, counter="step {task.completed}/{task.total}", info=True,
        quiet=quiet))  # fmt: skip
    progress.update(task, info="starting workers")

    def on_step(step: int, metrics: dict[str, float]) -> None:
        info = f"reward {metrics.get('reward', 0):.2f} lag {metrics.get('staleness_max', 0):.0f}"
        progress.update(task, completed=step, info=info)

    return on_step


def _env_progress(version: int, metrics: dict[str, float]) -> None:
    if "eval_return" not in metrics:
        return  # a line per evaluation, not per update
    train = f"{metrics['train_return']:.3g}" if "train_return" in metrics else "-"
    _line(f"  {metrics['wall_s']:6.1f}s  {metrics['env_steps']:>9,} steps  version {version}  "
          f"train return {train}  eval {metrics['eval_return']:.3g}")  # fmt: skip


def _line(text: str) -> None:
    """``text`` as it is (no markup, no emoji codes) on a line of stderr."""
    console(stderr=True).print(text, markup=False, emoji=False)


def render_runs(title: str, results: dict[str, Any], paths: dict[str, str], *, as_json: bool,
                compare: bool) -> None:  # fmt: skip
    """Print runs (label -> RunResult): JSON (one run: its ``to_json()`` and ``artifacts``; a
    comparison: ``runs`` by label, ``speedup_vs_first``, ``artifacts``) or a table with a row
    per run, captioned with (one run) its staleness histogram and the artifacts written."""
    base = next(iter(results.values())).samples_per_s or 1.0
    speedup = {k: r.samples_per_s / base for k, r in results.items()}
    doc: Any = None
    if as_json:
        runs = {k: {**r.to_json(), "artifacts": paths} for k, r in results.items()}
        doc = {"runs": runs, "speedup_vs_first": speedup, "artifacts": paths} if compare else (
            next(iter(runs.values())))  # fmt: skip
    rows = [_row(k, r) | ({"speed": f"{speedup[k]:.2f}x"} if compare else {})
            for k, r in results.items()]  # fmt: skip
    hist = next(iter(results.values())).staleness_hist
    caption = None if compare else "staleness histogram (trained samples by lag): " + (
        ", ".join(f"{k}: {v}" for k, v in sorted(hist.items())) or "-")  # fmt: skip
    print_result(as_json, doc, title, list(rows[0]), [list(row.values()) for row in rows],
                 caption=caption, files=list(paths.values()))  # fmt: skip


def _row(label: str, r: Any) -> dict[str, Any]:
    """One run's table row, by column: a task's accuracies, an env run's return and steps."""
    if r.env is None:
        target = r.config.get("target_accuracy") or 0.9
        to_target = r.time_to_accuracy(target)
        outcome = {"samples/s": f"{r.samples_per_s:,.0f}", "acc start": r.initial_accuracy,
                   "acc final": r.final_accuracy}  # fmt: skip
    else:
        target, to_target = r.target_return, r.time_to_target_s
        outcome = {"env steps/s": f"{r.env_steps_per_s:,.0f}", "env steps": f"{r.env_steps:,}",
                   "eval mean return": f"{r.eval_mean_return:.4g}"}  # fmt: skip
    dropped = sum(r.ledger.dropped.values()) - r.ledger.dropped.get("unfinished", 0)
    return {
        "run": label, "updates": r.steps, "wall s": f"{r.wall_s:.1f}", **outcome,
        f"s to {target}": "-" if to_target is None else f"{to_target:.1f}",
        "stale max": r.staleness_max,
        f"idle {'/'.join(r.idle_ratio)}": "/".join(f"{v:.0%}" for v in r.idle_ratio.values()),
        "dropped": dropped, "ledger": "ok" if r.ledger.ok else "FAIL",
    }  # fmt: skip
