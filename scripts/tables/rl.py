"""Tables of the RL docs (docs/rl/) and of the k-way merge page (docs/algorithms.md).

Rendered from ``benchmarks/results/*.json`` (``rl_modes.json``, ``rl_modes_throughput.json``,
``rl_replay.json``, ``merge.json``); the presets table is read from the code that defines the
presets, :mod:`nobubble.rl.algo.presets`.
"""

from __future__ import annotations

import re
import textwrap
from collections.abc import Sequence
from typing import Any

from scripts.tables import Renderer, f, load, md_table, pct, times


def _int(value: float) -> str:
    """A count or rate rounded to an integer, with thousands separators: ``15,942``."""
    return f"{round(value):,}"


def _size(n: int) -> str:
    """An item count: ``10^6`` for a power of ten from 10^6 on, else ``1,000``."""
    if n >= 10**6 and 10 ** (len(str(n)) - 1) == n:
        return f"10^{len(str(n)) - 1}"
    return f"{n:,}"


def _idle(gen: float, train: float) -> str:
    return f"{pct(gen, 0)} / {pct(train, 0)}"


def _staleness_bound(row: dict[str, Any]) -> int | None:
    """The run's staleness bound, if its JSON records one (``max_staleness``; older files
    wrote ``eta``)."""
    for key in ("max_staleness", "eta"):
        if row.get(key) is not None:
            return row[key]
    return None


def _prose(*sentences: str) -> str:
    """Sentences as one paragraph wrapped like the hand-written text around it (never
    between a number and its unit)."""
    text = re.sub(r"(\d) (s|µs)\b", "\\1\0\\2", " ".join(sentences))
    return textwrap.fill(text, width=96, break_on_hyphens=False).replace("\0", " ")


def _seconds_list(values: Sequence[float]) -> str:
    return ", ".join(f"{v:.0f} s" for v in values)


# --- docs/rl/system.md ------------------------------------------------------------------


def modes() -> str:
    """The learning runs of ``benchmarks/rl_modes.py`` (``rows`` of ``rl_modes.json``), with
    the per-mode summary below the table."""
    data = load("rl_modes.json")
    curves = data.get("curves", {})
    rows = []
    for r in data["rows"]:
        label = r["run"]
        bound = _staleness_bound(r)
        if bound is not None and not label.startswith("sync"):
            label += f" (max_staleness {bound})"
        final = f(r["acc_final"], 3)
        best = max((p["accuracy"] for p in curves.get(r["run"], [])), default=r["acc_final"])
        if best > r["acc_final"]:
            final += f" ({f(best, 3)})"
        t09 = r["t_to_0.9_s"]
        rows.append(
            [
                label,
                r["steps"],
                f(r["wall_s"], 1),
                f(r["samples_per_s"], 0),
                times(r["speedup"]),
                f(r["acc_start"], 3),
                final,
                "-" if t09 is None else f"{f(t09, 1)} s",
                r["staleness_max"],
                _idle(r["idle_rollout"], r["idle_trainer"]),
            ]
        )
    headers = [
        "run",
        "steps",
        "wall s",
        "samples/s",
        "vs sync",
        "acc start",
        "acc final (best)",
        "t to 0.9",
        "stale max",
        "idle gen / train",
    ]
    table = md_table(headers, rows)

    parts = []
    for mode, s in data["summary"].items():
        reached = [t for t in s["t_to_0.9_s"] if t is not None]
        if s["acc_final_min"] == s["acc_final_max"]:
            spread = f"all {len(s['t_to_0.9_s'])} at {f(s['acc_final_min'], 3)}"
        else:
            spread = f"min {f(s['acc_final_min'], 3)}, max {f(s['acc_final_max'], 3)}"
        when = f" ({_seconds_list(reached)})" if reached else ""
        parts.append(
            f"{mode}: final accuracy mean {f(s['acc_final_mean'], 3)} ({spread}), "
            f"{len(reached)} of {len(s['t_to_0.9_s'])} seeds reach 0.9{when}"
        )
    first = data["rows"][0]
    busy = (
        f"Busy seconds in {first['run']}: generation {first['busy_gen_s']:.0f} s, "
        f"training {first['busy_train_s']:.0f} s."
    )
    return f"{table}\n\n" + _prose("; ".join(parts) + ".", busy)


def modes_throughput() -> str:
    """The throughput part of ``benchmarks/rl_modes.py`` (``rl_modes_throughput.json``)."""
    rows = [
        [
            r["mode"],
            f(r["samples_per_s_median"], 0),
            ", ".join(f(v, 0) for v in r["samples_per_s_all"]),
            times(r["speedup"]),
            f(r["busy_gen_s_median"], 1),
            f(r["busy_train_s_median"], 1),
            _idle(r["idle_gen_median"], r["idle_train_median"]),
            r["staleness_max"],
        ]
        for r in load("rl_modes_throughput.json")
    ]
    headers = [
        "mode",
        "samples/s (median)",
        "rounds",
        "vs sync",
        "gen busy s",
        "train busy s",
        "idle gen / train",
        "stale max",
    ]
    return md_table(headers, rows)


# --- docs/rl/algorithms.md --------------------------------------------------------------


def replay() -> str:
    """``benchmarks/rl_replay.py``: sum tree vs linear sampler, with the crossover below."""
    from nobubble.rl.algo import aggressive

    data = load("rl_replay.json")
    res = sorted(data["results"], key=lambda r: r["capacity"])
    caption = (
        f"Median µs per round over {data['repeats']} rounds, batch {data['batch']}, "
        "both samplers timed round-robin in the same run:"
    )
    table = md_table(
        ["capacity", "sum tree µs", "linear µs", "speed-up"],
        [
            [
                _int(r["capacity"]),
                _int(r["sum_tree_us"]),
                _int(r["linear_us"]),
                times(r["speedup"], 1),
            ]
            for r in res
        ],
    )
    # smallest capacity from which the tree is faster at every larger capacity measured
    wins = [i for i in range(len(res)) if all(r["speedup"] > 1 for r in res[i:])]
    lo, hi = res[0], res[-1]
    growth = (
        f"From {_int(lo['capacity'])} to {_int(hi['capacity'])} items the tree's time grows "
        f"{times(hi['sum_tree_us'] / lo['sum_tree_us'], 1)}, the baseline's "
        f"{times(hi['linear_us'] / lo['linear_us'], 0)}."
    )
    preset = aggressive().replay_capacity
    if not wins:
        where = "In this run the flat array is faster at every capacity measured."
    elif wins[0] == 0:
        where = "In this run the tree is faster at every capacity measured."
    else:
        below, cross = res[wins[0] - 1]["capacity"], res[wins[0]]["capacity"]
        if preset <= below:
            side = "where the flat array is faster"
        elif preset >= cross:
            side = "where the tree is faster"
        else:
            side = "between the two"
        where = (
            f"In this run the flat array is faster up to {_int(below)} items and the tree from "
            f"{_int(cross)} on ({times(hi['speedup'], 1)} faster at {_int(hi['capacity'])}); "
            f"the aggressive preset's {_int(preset)}-sample buffer lies {side}."
        )
    return f"{_prose(caption)}\n\n{table}\n\n{_prose(growth, where)}"


def _setting(cfg: Any) -> dict[str, str]:
    """One preset's settings, worded as on the page."""
    weighting = {"none": "none", "inverse": "1 / (1 + lag)", "exp": "exp(-lag)"}
    if cfg.replay_capacity == 0:
        replay = "none"
    elif cfg.prioritized_replay:
        replay = (
            f"{cfg.replay_capacity} samples, prioritized "
            f"(alpha {cfg.replay_alpha:g}, beta {cfg.replay_beta:g})"
        )
    else:
        replay = f"{cfg.replay_capacity} samples, uniform"
    clip = (
        f"{cfg.clip_low:g}"
        if cfg.clip_low == cfg.clip_high
        else f"{cfg.clip_low:g}-{cfg.clip_high:g}"
    )
    return {
        "`max_staleness` (policy lag K)": str(cfg.max_staleness),
        "PPO clip": clip,
        "behaviour correction": "V-trace's truncated IS" if cfg.use_vtrace else "none",
        "staleness weighting": weighting[cfg.staleness_weighting],
        "buffer at weight sync": "cleared" if cfg.clear_buffer_on_sync else "kept",
        "replay": replay,
    }


def presets() -> str:
    """The settings of ``conservative()`` and ``aggressive()``, read from the presets."""
    from nobubble.rl.algo import aggressive, conservative

    c, a = _setting(conservative()), _setting(aggressive())
    return md_table(
        ["setting", "`conservative()`", "`aggressive()`"],
        [[k, c[k], a[k]] for k in c],
        align="lll",
    )


# --- docs/algorithms.md -----------------------------------------------------------------

_METHODS = ("kmerge", "heapq_merge", "sorted_chain", "merge_k_lists", "merge_k_lists_pairwise")


def merge_benchmark() -> str:
    """``benchmarks/merge.py``: median seconds per method, the two ratios to heapq.merge."""
    data = load("merge.json")
    res = data["results"]
    table = md_table(
        [
            "k",
            "N",
            "kmerge",
            "heapq.merge",
            "sorted(chain)",
            "merge_k_lists",
            "pairwise",
            "kmerge / heapq.merge",
            "merge_k_lists / heapq.merge",
        ],
        [
            [_size(r["k"]), _size(r["n"])]
            + [f(r["seconds"][m], 3) for m in _METHODS]
            + [f(r["kmerge_over_heapq"], 3), f(r["merge_k_lists_over_heapq"], 2)]
            for r in res
        ],
    )
    worst = max(r["kmerge_over_heapq"] for r in res)
    verdict = "meets" if worst <= 1.05 else "misses"
    note = (
        f"Median seconds of {data['repeats']} runs. In this run `kmerge / heapq.merge` is at "
        f"most {f(worst, 3)}, which {verdict} the goal of <= 1.05."
    )
    return f"{table}\n\n{_prose(note)}"


# --- docs/rl/own-model.md -----------------------------------------------------------------


def _first_wall(curve: list[dict[str, Any]], key: str, level: float) -> float | None:
    return next((p["wall_s"] for p in curve if (p.get(key) or 0) >= level), None)


def vs_trl() -> str:
    """TRL's GRPOTrainer against nobubble sync and fully-async (``rl_vs_trl.json``)."""
    data = load("rl_vs_trl.json")
    setup, runs = data["setup"], data["runs"]
    base = runs["trl"]["samples_per_s"]
    level = 0.5
    rows = []
    for name, r in runs.items():
        if "skipped" in r:
            continue
        curve = r["curve"]
        rewards = [p.get("eval_reward") or 0.0 for p in curve]
        t_half = _first_wall(curve, "eval_reward", level)
        rows.append(
            [
                name,
                _int(r["samples_per_s"]),
                times(r["samples_per_s"] / base),
                f(r["wall_s"]),
                f"{f(rewards[0], 2)} -> {f(max(rewards), 2)}",
                "-" if t_half is None else f(t_half),
                f"{f(r['initial_accuracy'], 2)} -> {f(r['final_accuracy'], 2)}",
            ]
        )
    table = md_table(
        [
            "run",
            "samples/s",
            "vs TRL",
            "wall s",
            "eval reward start -> best",
            f"s to reward {level}",
            "exact match",
        ],
        rows,
    )
    v = setup["versions"]
    ratio = runs["nobubble-fully-async"]["samples_per_s"] / base
    verdict = "meets" if ratio >= 2 else "misses"
    note = (
        f"{setup['steps']} steps of {setup['prompts_per_step']} prompts x {setup['group_size']} "
        f"completions, lr {setup['lr']}, seed {setup['seed']}, on {setup['cpu_count']} cores "
        f"(TRL {v['trl']}, transformers {v['transformers']}, torch {v['torch']}). Fully-async "
        f"delivers {times(ratio)} TRL's samples/s, which {verdict} the 2x goal. Samples/s counts "
        "trained completions per second of wall clock from the first step to the last, the "
        "periodic greedy evaluations included on both sides."
    )
    return f"{table}\n\n{_prose(note)}"


def lag() -> str:
    """The presets against naive PPO under lag, with a slow trainer (``rl_lag.json``)."""
    data = load("rl_lag.json")
    setup, rows = data["setup"], data["rows"]
    table = md_table(
        ["run", "algo", "max lag", "steps", "final acc", "time to 0.9 s", "samples/s", "reused"],
        [
            [
                r["run"],
                r["algo"],
                r["staleness_max"],
                r["steps"],
                f(r["final_accuracy"], 3),
                "-" if r["t_to_0.9_s"] is None else f(r["t_to_0.9_s"]),
                _int(r["samples_per_s"]),
                _int(r["reused"]),
            ]
            for r in rows
        ],
    )
    budget = setup["budget"]

    def met(prefix: str) -> str:
        mine = [r for r in rows if r["run"].startswith(prefix)]
        ok = sum(r["t_to_0.9_s"] is not None and r["t_to_0.9_s"] <= budget for r in mine)
        return f"{prefix} reached 0.9 within {budget:.0f} s on {ok} of {len(mine)} seeds"

    note = (
        f"Digits, trainer +{setup['trainer_delay']} s per step, max staleness "
        f"{setup['max_staleness']} for the aggressive preset and naive PPO; a run stops at "
        f"0.9 accuracy or after {budget:.0f} s. {met('aggressive')}; {met('conservative')}; "
        f"{met('naive PPO')}."
    )
    return f"{table}\n\n{_prose(note)}"


def generators() -> str:
    """Generator scaling, wait-bound and compute-bound (``rl_generators.json``)."""
    data = load("rl_generators.json")
    setup, rows = data["setup"], data["rows"]
    table = md_table(
        ["generation", "generators", "samples/s", "vs 1 generator", "trainer idle"],
        [
            [
                "waits (remote)" if r["knob"] == "wait" else "computes (local)",
                r["generators"],
                _int(r["samples_per_s"]),
                times(r["speedup_vs_1"]),
                pct(r["idle_trainer"], 0),
            ]
            for r in rows
        ],
    )
    note = (
        f"Fully-async, {setup['steps']} steps, medians of {setup['rounds']} interleaved rounds "
        f"on {setup['cpu_count']} cores. A waiting generator sleeps {setup['wait']} s per "
        "call; a computing one samples with a policy of width 128."
    )
    return f"{table}\n\n{_prose(note)}"


def actor_learner() -> str:
    """``benchmarks/rl_actor_learner.py``: time to return 475 on CartPole-v1 and env steps/s,
    each architecture beside Stable-Baselines3 PPO, with and without a 1 ms env step."""
    data = load("rl_actor_learner.json")
    rows = []
    for name, res in data["results"].items():
        arch, delay = name.split("@")
        summ, runs = res["summary"], res["runs"]
        t = summ["time_to_475_s"]
        rows.append([
            arch, delay, summ["reached"], f(t["mean"]) + " s", f(t["stdev"]) + " s",
            ", ".join(f(r["time_to_475_s"]) for r in runs),
            _int(summ["env_steps_per_s"]["mean"]),
        ])  # fmt: skip
    headers = ["architecture", "env step delay", "seeds reaching 475", "time to 475 (mean)",
               "sd", "per seed (s)", "env steps/s"]  # fmt: skip
    return (
        f"{md_table(headers, rows, 'llrrrlr')}\n\n{data['eval_episodes']} greedy evaluation "
        f"episodes per check; {data['cpu_count']} cores, load average "
        f"{data['load_average_at_end'][0]:.1f} at the end of the run."
    )


TABLES: dict[str, Renderer] = {
    "rl.actor_learner": actor_learner,
    "rl.lag": lag,
    "rl.generators": generators,
    "rl.vs_trl": vs_trl,
    "rl.modes": modes,
    "rl.modes_throughput": modes_throughput,
    "rl.replay": replay,
    "rl.presets": presets,
    "merge.benchmark": merge_benchmark,
}
