"""The ablation and many-learners tables of docs/rl/system.md, from ``rl_ablation.json``
and ``rl_learners.json``."""

from __future__ import annotations

from typing import Any

from scripts.tables import f, load, md_table
from scripts.tables.rl import _int, _prose

MARGIN = 0.1  # accuracy steps are 1/21 here: a gain of one or two prompts is noise


def _t90(row: dict[str, Any]) -> str:
    return "-" if row["t_to_0.9_s"] is None else f(row["t_to_0.9_s"])


def ablation() -> str:
    """Each lag fix alone and all together, per eta (``rl_ablation.json``)."""
    data = load("rl_ablation.json")
    setup, rows = data["setup"], data["rows"]
    table = md_table(
        ["fix", "eta", "final acc", "best acc", "time to 0.9 s", "samples/s", "dropped stale",
         "reused"],
        [[r["fix"], r["eta"], f(r["final_accuracy"], 3), f(r["best_accuracy"], 3), _t90(r),
          _int(r["samples_per_s"]), _int(r["dropped_stale"]), _int(r["reused"])]
         for r in rows],
    )  # fmt: skip
    notes = []
    for eta in sorted({r["eta"] for r in rows}):
        mine = [r for r in rows if r["eta"] == eta]
        naive = next(r for r in mine if r["fix"] == "naive PPO")
        better = [r["fix"] for r in mine if r["fix"] != "naive PPO"
                  and r["final_accuracy"] >= naive["final_accuracy"] + MARGIN]  # fmt: skip
        notes.append(
            f"At eta {eta}, naive PPO ends at {naive['final_accuracy']:.3f}; "
            + (f"{', '.join(better)} end" if better else "no fix ends")
            + f" at least {MARGIN} higher."
        )
    head = (
        f"{setup['mode']}, digits, {setup['steps']} trainer steps per run, trainer "
        f"+{setup['trainer_delay_s']} s per step, seed {setup['seed']}, one run per cell."
    )
    return f"{table}\n\n{_prose(head, *notes)}"


def learners() -> str:
    """One learner against two with each aggregation mode (``rl_learners.json``)."""
    data = load("rl_learners.json")
    setup, rows = data["setup"], data["rows"]
    table = md_table(
        ["run", "seed", "learners", "steps", "time to 0.9 s", "final acc", "samples/s",
         "samples per learner", "push staleness max"],
        [[r["run"], r["seed"], r["learners"], r["steps"], _t90(r), f(r["final_accuracy"], 3),
          _int(r["samples_per_s"]), " / ".join(_int(v) for _, v in sorted(r["by_learner"].items())),
          "-" if r["learners"] == 1 or r["run"] in ("sync", "local-sgd")
          else f"{r['push_staleness_max']:.0f}"]
         for r in rows],
    )  # fmt: skip
    budget = setup["budget_s"]
    reached = {}
    for r in rows:
        ok = r["t_to_0.9_s"] is not None
        reached.setdefault(r["run"], []).append(ok)
    summary = "; ".join(f"{run}: {sum(v)} of {len(v)}" for run, v in reached.items())
    note = (
        f"{setup['mode']} (max staleness {setup['max_staleness']}), {setup['task']}, GRPO, "
        f"8 groups x 32 responses per step; a run stops at 0.9 or after {budget:.0f} s. "
        f"Runs reaching 0.9: {summary}."
    )
    return f"{table}\n\n{_prose(note)}"


TABLES = {"rl.ablation": ablation, "rl.learners": learners}
