"""Tables of the pipeline docs, rendered from benchmarks/results/*.json.

``docs/pipeline/schedules.md``: the paper's bubble table (``zb_paper_table.json``), the
comparison at P=8, M=24 (``pp_compare.json``), the V schedules of controllable memory and
the frontier (``pp_v_memory.json``), simulator scaling (``pp_scaling.json``).
``docs/pipeline/ilp.md``: the ILP grid, P = 8, memory sweep, solver and two-chunk tables
(``ilp_scaling.json``). ``docs/pipeline/runtime.md``: the B/W split cost and the measured
speed-ups (``pp_runtime.json``). ``docs/pipeline/handshake.md``: the handshake dispatch
policy against the static orders (``pp_handshake.json``). ``docs/pipeline/replan.md``: the
static cut against the re-planned one under a straggler (``pp_replan.json``).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

from scripts.tables import Renderer, f, load, md_table, pct, times

# -- schedules.md ---------------------------------------------------------------------------

_PAPER_COLUMNS = (("1f1b", "1F1B ours / paper"), ("zb-h1", "ZB-H1"), ("zb-h2", "ZB-H2"),
                  ("zb-1p", "ZB-1p"), ("zb-2p", "ZB-2p"))  # fmt: skip


def paper_table() -> str:
    """Our bubble rate beside the published one, per configuration of the paper."""
    rows = []
    for r in load("zb_paper_table.json")["rows"]:
        s = r["schedules"]
        cells = [r["model"], r["p"], r["m"]]
        cells += [f"{s[n]['ours']:.4f} / {s[n]['published']:.4f}" for n, _ in _PAPER_COLUMNS]
        cells.append(times(s["zb-2p"]["peak_memory_vs_1f1b"]))
        rows.append(cells)
    headers = ["model", "p", "m", *(h for _, h in _PAPER_COLUMNS), "ZB-2p memory"]
    return md_table(headers, rows)


def _best(rows: Sequence[dict], key: str) -> float | None:
    values = [r[key] for r in rows if r[key] is not None]
    return max(values) if values else None


def compare_p8_m24() -> str:
    """Every schedule on the paper's 1.5B and 6.2B costs; the best bubble and throughput of
    each model in bold."""
    data = load("pp_compare.json")
    models = list(data["models"])
    per_model = {m: {r["schedule"]: r for r in data["models"][m]["rows"]} for m in models}
    first = data["models"][models[0]]["rows"]
    best = {
        m: (
            min(r["bubble_rate"] for r in per_model[m].values() if r["bubble_rate"] is not None),
            _best(list(per_model[m].values()), "throughput_vs_1f1b"),
        )
        for m in models
    }

    def bold(text: str, on: bool) -> str:
        return f"**{text}**" if on else text

    rows = []
    for row in first:
        name = row["schedule"]
        label = f"{name} (v={data['num_chunks']})" if name == "interleaved-1f1b" else name
        cells: list[object] = []
        starred = False
        for m in models:
            r = per_model[m][name]
            if r["bubble_rate"] is None:  # torch's invalid order, or a size it refuses
                cells += ["invalid order" if "invalid" in r["note"] else "not built", "", ""]
                continue
            top_bubble = r["bubble_rate"] == best[m][0]
            top_speed = r["throughput_vs_1f1b"] == best[m][1]
            starred |= top_bubble or top_speed
            cells += [
                bold(pct(r["bubble_rate"], 2), top_bubble),
                times(r["peak_memory_vs_1f1b"]),
                bold(times(r["throughput_vs_1f1b"], 3), top_speed),
            ]
        if all(per_model[m][name]["bubble_rate"] is None for m in models):
            cells = [cells[0]] + [""] * (len(cells) - 1)  # say it once
        rows.append([bold(label, starred), row["source"], *cells])
    headers = ["schedule", "from"]
    for m in models:
        headers += [f"{m} bubble", f"{m} peak mem", f"{m} throughput"]
    return md_table(headers, rows, align="ll" + "r" * (len(headers) - 2))


def _seconds(value: float) -> str:
    """Seconds as the scaling table writes them: 4 decimals below 0.05 s, else 3."""
    return f(value, 4 if value < 0.05 else 3)


def scaling() -> str:
    """Simulation CPU time against the number of actions, beside the sweep baseline."""
    data = load("pp_scaling.json")
    rows = [
        [r["p"], r["m"], f"{r['actions']:,}", _seconds(r["simulate_cpu_s"]),
         f(r["cpu_us_per_action"]), _seconds(r["sweep_baseline_cpu_s"])]
        for r in data["rows"]
    ]  # fmt: skip
    table = md_table(
        ["p", "m", "actions", "CPU s", "CPU us / action", "sweep baseline CPU s"], rows
    )
    load_avg = data["load_average"][0]
    return (
        f"{table}\n\nMedian of {data['repeats']} runs; load average {load_avg:.1f} after the run."
    )


def scaling_zb2p() -> str:
    """Generating and simulating zb-2p at p=32, m=256."""
    z = load("pp_scaling.json")["zb2p_p32_m256"]
    row = [f"{z['actions']:,}", f(z["generate_cpu_s"], 2), f(z["simulate_cpu_s"], 2),
           f(z["total_s"], 1)]  # fmt: skip
    return md_table(["actions", "generate CPU s", "simulate CPU s", "wall s (both)"], [row])


# -- ilp.md ---------------------------------------------------------------------------------

_ILP_HEADERS = ["case", "best heuristic: span ms (bubble)", "ILP status",
                "ILP span ms (bubble)", "gap", "seconds", "span cut"]  # fmt: skip


def _ilp_rows(rows: Sequence[dict[str, Any]]) -> str:
    out = []
    for r in rows:
        ilp = (
            f"{r['ilp_span']:.3f} ({pct(r['ilp_bubble'], 2)})" if r["ilp_span"] is not None else "-"
        )
        out.append([
            r["case"], f"{r['heuristic']} {r['heuristic_span']:.3f} ({pct(r['heuristic_bubble'], 2)})",
            r["status"], ilp, pct(r["gap"], 2) if r["gap"] is not None else "-",
            f(r["solve_seconds"]), pct(r["span_reduction"], 2) if r["span_reduction"] is not None else "-",
        ])  # fmt: skip
    return md_table(_ILP_HEADERS, out, align="lrlrrrr")


def ilp_grid() -> str:
    return _ilp_rows(load("ilp_scaling.json")["grid"])


def ilp_p8() -> str:
    return _ilp_rows(load("ilp_scaling.json")["scaling"])


def ilp_memory_sweep() -> str:
    return _ilp_rows(load("ilp_scaling.json")["memory_sweep"])


def ilp_solvers() -> str:
    """The same model in CP-SAT and as the big-M MILP in HiGHS and SCIP."""
    rows = []
    for r in load("ilp_scaling.json")["solvers"]:
        cells: list[object] = [r["case"], r["binaries"]]
        for solver in ("cpsat", "highs", "scip"):
            cells.append(f"{f(r[f'{solver}_seconds'])} s {r[f'{solver}_status']}")
        cells.append(f"{r['cpsat_span']:.3f}")
        rows.append(cells)
    headers = ["case", "binaries", "CP-SAT", "HiGHS", "SCIP", "optimum span ms"]
    return md_table(headers, rows)


def _span(span: float | None, bubble: float | None) -> str:
    return "-" if span is None else f"{span:.3f} ({pct(bubble, 2)})"


def _ilp_chunk_rows(rows: Sequence[dict[str, Any]]) -> str:
    """Two chunks per rank: the baseline (or the best warm start), the solver's schedule,
    its proven bound as a bubble floor, gap and time."""
    out = []
    for r in rows:
        name = r["baseline"] or r["heuristic"] or "-"
        base = (r["baseline_span"], r["baseline_bubble"]) if r["baseline"] else (
            r["heuristic_span"], r["heuristic_bubble"])  # fmt: skip
        limit = "none" if r["mem_limit_MF"] is None else f"{r['mem_limit_MF']:.3g}"
        out.append([
            r["case"], limit, f"{name} {_span(*base)}", r["status"],
            _span(r["ilp_span"], r["ilp_bubble"]),
            "-" if r["lower_bound"] is None else f"{r['lower_bound']:.3f}",
            "-" if r["bubble_lower_bound"] is None else pct(r["bubble_lower_bound"], 2),
            "-" if r["gap"] is None else pct(r["gap"], 2), f(r["solve_seconds"]),
        ])  # fmt: skip
    headers = ["case", "limit M_F", "baseline: span ms (bubble)", "ILP status",
               "ILP span ms (bubble)", "bound ms", "bubble >=", "gap", "seconds"]  # fmt: skip
    return md_table(headers, out, align="lrrlrrrrr")


def ilp_chunks_grid() -> str:
    return _ilp_chunk_rows(load("ilp_scaling.json")["chunks_grid"])


def ilp_chunks_p8() -> str:
    return _ilp_chunk_rows(load("ilp_scaling.json")["chunks_p8"])


# -- runtime.md -----------------------------------------------------------------------------


def runtime_bw_split() -> str:
    """T_B, T_W and the fused backward per stage, and the bytes held between B and W."""
    rows = [
        [r["stage"], r["method"], f(r["t_b"]), f(r["t_w"]), f(r["t_b"] + r["t_w"]),
         f(r["fused"]), f(r["ratio"], 3), f(r["forward_saved_mib"], 2), f(r["held_mib"], 2)]
        for r in load("pp_runtime.json")["bw_split"]
    ]  # fmt: skip
    headers = ["stage", "method", "T_B ms", "T_W ms", "T_B+T_W", "fused BW", "ratio",
               "F saved MiB", "held B->W MiB"]  # fmt: skip
    return md_table(headers, rows, align="ll" + "r" * (len(headers) - 2))


def _mib_pair(values: Sequence[float]) -> str:
    return " / ".join(f(v) for v in values)


def _bubble(value: float) -> str:
    return pct(max(value, 0.0))  # the simulator's exact zero can come out as -1e-16


def runtime_schedules() -> str:
    """Measured step time, speed-up, bubble and peak memory beside the simulator's."""
    data = load("pp_runtime.json")
    rows = []
    for r in data["schedules"]:
        error = "-" if r["schedule"] == "1f1b" else f"{100 * r['speedup_error']:+.1f}%"
        rows.append([
            r["schedule"], f(1e3 * r["median_step_s"]), f(1e3 * r["predicted_makespan_s"]),
            f(r["measured_speedup_step"], 3), f(r["paired_speedup"], 3),
            f(r["predicted_speedup"], 3), error, _bubble(r["measured_bubble"]),
            _bubble(r["predicted_bubble"]), _mib_pair(r["peak_activation_mib"]),
            _mib_pair(r["predicted_peak_mib"]),
        ])  # fmt: skip
    headers = ["schedule", "step ms", "sim ms", "speed-up", "paired", "sim speed-up", "error",
               "bubble", "sim bubble", "peak act MiB r0/r1", "simulated"]  # fmt: skip
    table = md_table(headers, rows)
    prof = data["profile"]
    ops = [s[k] for s in prof["stages"] for k in ("t_f", "t_b", "t_w")]
    load_avg = " -> ".join(f(x) for x in data["load_average"])
    return (
        f"{table}\n\nProfiled op costs {f(min(ops))}-{f(max(ops))} ms of CPU time, T_comm "
        f"{prof['t_comm']:.2f} ms; medians of {data['schedules'][0]['steps_measured']} steps; "
        f"load average {load_avg} on {data['cpus']} CPUs during the run."
    )


def runner_vs_torch() -> str:
    """``benchmarks/pp_runner_vs_torch.py``: PipelineRunner against torch's runtime."""
    data = load("pp_runner_vs_torch.json")
    in_run = all("in_run_speedup_vs_1f1b" in r for r in data["rows"])  # files before it lack it
    rows = []
    for r in data["rows"]:
        row = [r["schedule"], f(1e3 * r["torch_step_s"]), f(1e3 * r["nobubble_step_s"]),
               f(r["nobubble_over_torch"], 3), times(r["torch_speedup_vs_1f1b"], 3),
               times(r["nobubble_speedup_vs_1f1b"], 3), times(r["predicted_speedup_vs_1f1b"], 3),
               f"{100 * r['speedup_error']:+.1f}%"]  # fmt: skip
        if in_run:
            row += [times(r["in_run_speedup_vs_1f1b"], 3),
                    f"{100 * r['in_run_speedup_error']:+.1f}%",
                    f"{100 * r['in_run_step_error']:+.1f}%"]  # fmt: skip
        rows.append(row)
    headers = ["schedule", "torch ms", "nobubble ms", "nobubble / torch", "torch vs 1f1b",
               "nobubble vs 1f1b", "simulated vs 1f1b", "error"]  # fmt: skip
    if in_run:
        headers += ["in-run sim vs 1f1b", "error", "step vs in-run sim"]
    per_round = ""
    if "rounds" in data:  # files before it hold one run
        ratios = "; ".join(f"{r['schedule']} " + ", ".join(f(x, 3) for x in
                           r["nobubble_over_torch_per_round"]) for r in data["rows"])  # fmt: skip
        per_round = (
            f", then the median of {data['rounds']} runs (nobubble / torch per run: {ratios})"
        )
    return (
        f"{md_table(headers, rows)}\n\nMedians of {data['steps']} steps per path, the paths "
        f"alternating{per_round}; batch {data['batch']} x {data['seq_len']} tokens in "
        f"{data['microbatches']} microbatches on {data['ranks']} gloo ranks; torch "
        f"{data['torch']}."
    )


# -- schedules.md: the V schedules of controllable memory, and the frontier ------------------

_V_NAMES = ("v-min", "v-half", "v-zb", "zb-v", "zb-1p", "1f1b")


def v_memory_table() -> str:
    """Bubble rate and peak activation memory (rank units) of the V schedules beside ZB-V,
    ZB-1p and 1F1B, per configuration of the paper (``pp_v_memory.json``)."""
    rows = []
    for r in load("pp_v_memory.json")["rows"]:
        s = r["schedules"]
        cells = [r["model"], r["p"], r["m"]]
        cells += [f"{pct(s[n]['bubble_rate'])} ({s[n]['peak_memory']:.2f})" for n in _V_NAMES]
        rows.append(cells)
    headers = ["model", "p", "m", "V-Min", "V-Half", "V-ZB", "ZB-V", "ZB-1p", "1F1B"]
    return md_table(headers, rows)


def frontier_p8_m24() -> str:
    """The Pareto-optimal points of the frontier at P=8, M=24, per model."""
    rows = []
    for fr in load("pp_v_memory.json")["frontiers"]:
        points = {q["schedule"]: q for q in fr["points"]}
        best = sorted((points[n] for n in fr["pareto"]), key=lambda q: q["peak_memory"])
        rows.append(
            [
                fr["model"],
                f"{fr['seconds']:.1f} s",
                "; ".join(
                    f"{q['schedule']} {q['peak_memory']:.2f} / {pct(q['bubble_rate'])}"
                    for q in best
                ),
            ]
        )
    return md_table(["model", "time", "Pareto set: schedule memory / bubble"], rows)


TABLES: dict[str, Renderer] = {
    "pipeline.paper_table": paper_table,
    "pipeline.compare_p8_m24": compare_p8_m24,
    "pipeline.v_memory": v_memory_table,
    "pipeline.frontier_p8_m24": frontier_p8_m24,
    "pipeline.scaling": scaling,
    "pipeline.scaling_zb2p": scaling_zb2p,
    "pipeline.ilp_grid": ilp_grid,
    "pipeline.ilp_p8": ilp_p8,
    "pipeline.ilp_memory_sweep": ilp_memory_sweep,
    "pipeline.ilp_solvers": ilp_solvers,
    "pipeline.ilp_chunks_grid": ilp_chunks_grid,
    "pipeline.ilp_chunks_p8": ilp_chunks_p8,
    "pipeline.runtime_bw_split": runtime_bw_split,
    "pipeline.runtime_schedules": runtime_schedules,
    "pipeline.runner_vs_torch": runner_vs_torch,
}


# -- schedules.md: DualPipe / DualPipeV -----------------------------------------------------

_DUALPIPE_NAMES = ("dualpipe", "dualpipev", "zb-v", "1f1b")


def dualpipe_table() -> str:
    """DualPipe, DualPipeV, ZB-V and 1F1B on the paper's 12 configurations: bubble rate (peak
    activation memory in rank units), from ``pp_dualpipe.json``."""
    rows = []
    for r in load("pp_dualpipe.json")["rows"]:
        s = r["schedules"]
        cells: list[object] = [r["model"], r["p"], r["m"]]
        cells += [
            f"{pct(s[n]['bubble_rate'])} ({s[n]['peak_memory']:.2f})" for n in _DUALPIPE_NAMES
        ]
        cells.append(s["dualpipev"]["overlapped_cells_per_rank"])
        rows.append(cells)
    headers = ["model", "p", "m", "DualPipe (fold)", "DualPipeV", "ZB-V", "1F1B", "F&B cells"]
    return md_table(headers, rows)


TABLES["pipeline.dualpipe"] = dualpipe_table


# -- runtime.md: the optimizer step, synchronous against post-validated -------------------


def post_validation_table() -> str:
    """``benchmarks/pp_post_validation.py``: the optimizer phase after ``runner.step``."""
    data = load("pp_post_validation.json")
    rows = [
        [f(r["max_norm"], 1), r["rank"], f"{r['clipped_steps']}/{r['steps']}",
         f(1e3 * r["sync_optimizer_s"]), f(1e3 * r["post_optimizer_s"]),
         f(1e3 * r["sync_step_s"]), f(1e3 * r["post_step_s"])]
        for r in data["rows"]
    ]  # fmt: skip
    headers = ["max_norm", "rank", "steps clipped", "sync optimizer ms",
               "post-validated optimizer ms", "sync step ms", "post-validated step ms"]  # fmt: skip
    return (
        f"{md_table(headers, rows)}\n\nMedians of {data['steps']} steps per path, the paths "
        f"alternating; {data['schedule']} on {data['ranks']} gloo ranks, batch "
        f"{data['batch']}; the optimizer phase runs from the end of `runner.step` to a "
        "confirmed step."
    )


TABLES["pipeline.post_validation"] = post_validation_table


# -- handshake.md: the handshake dispatch policy against the static orders -----------------

_HANDSHAKE_PLANS = {"zb-h1": "ZB-H1", "zb-2p": "ZB-2p"}
_HANDSHAKE_CASES = (("none", "exact"), ("jitter", "jitter"), ("straggler", "straggler"))


def _gap_range(values: Sequence[float]) -> str:
    low, high = min(values), max(values)
    return (
        f"{100 * low:+.2f}" if abs(high - low) < 5e-5 else f"{100 * low:+.2f} to {100 * high:+.2f}"
    )


def handshake_table() -> str:
    """``benchmarks/pp_handshake.py``: the static order's bubble rate beside the handshake's
    (jitter: mean of the seeds) per configuration and plan, then what the rows say."""
    data = load("pp_handshake.json")
    rows = []
    for r in data["rows"]:
        cells: list[object] = [r["model"], r["p"], r["m"]]
        for plan in _HANDSHAKE_PLANS:
            for case, _ in _HANDSHAKE_CASES:
                c = r["plans"][plan][case]
                cells.append(f"{pct(max(c['static']['bubble_rate'], 0.0), 2)} / "
                             f"{pct(max(c['handshake']['bubble_rate'], 0.0), 2)}")  # fmt: skip
        cells.append("yes" if r["goal_met"] else "**no**")
        rows.append(cells)
    headers = ["model", "p", "m"]
    headers += [f"{_HANDSHAKE_PLANS[plan]} {label}" for plan in _HANDSHAKE_PLANS
                for _, label in _HANDSHAKE_CASES]  # fmt: skip
    table = md_table([*headers, "goal met"], rows)
    plans = [r["plans"][plan] for r in data["rows"] for plan in _HANDSHAKE_PLANS]
    seeds = [b - a for p in plans for a, b in p["jitter"]["per_seed"]]
    worse = sum(g > 1e-12 for g in seeds)

    def gaps(case: str, plan: str | None = None) -> str:
        chosen = [r["plans"][plan] for r in data["rows"]] if plan else plans
        return _gap_range([p[case]["bubble_gap"] for p in chosen])

    def makespans(case: str, plan: str) -> str:
        ratios = [r["plans"][plan][case]["handshake"]["makespan"]
                  / r["plans"][plan][case]["static"]["makespan"] - 1 for r in data["rows"]]  # fmt: skip
        return _gap_range(ratios)

    met = sum(r["goal_met"] for r in data["rows"])
    return (
        f"{table}\n\nThe goal is met on {met} of {len(data['rows'])} rows. Handshake minus static, "
        f"in points of bubble: exact {gaps('none')}; jitter {data['jitter']:g} (mean of "
        f"{len(data['seeds'])} seeds) {gaps('jitter')}, where {worse} of the {len(seeds)} single "
        f"seeds come out worse (by at most {100 * max(seeds):.2f}); straggler x"
        f"{data['straggler_factor']:g} on rank p/2: ZB-H1 {gaps('straggler', 'zb-h1')} (makespan "
        f"{makespans('straggler', 'zb-h1')}%), ZB-2p {gaps('straggler', 'zb-2p')} (makespan "
        f"{makespans('straggler', 'zb-2p')}%); the straggler on rank 0 instead "
        f"{gaps('straggler_first')}, on rank p-1 {gaps('straggler_last')}. Every run stayed "
        "within its memory limit, the static order's own peak on each rank (the benchmark "
        "checks it)."
    )


TABLES["pipeline.handshake"] = handshake_table


def replan_table() -> str:
    """``benchmarks/pp_replan.py``: the static cut against the re-planned one under a
    straggler that starts mid-run, one row per slow-down factor (medians over rounds). The
    share recovered is given on step time and on throughput (1 / step time), each beside
    what a perfect re-cut could win (one rank ``f`` times slower among ``p``)."""
    data = load("pp_replan.json")
    p = data["ranks"]
    rows, early = [], 0

    def share(rounds: list[dict], key: str) -> str:
        known = [r[key] for r in rounds if r[key] is not None]  # None: the static run kept pace
        if not known:
            return "-"
        return (f"{pct(statistics.median(known), 0)} "
                f"({pct(min(known), 0)} to {pct(max(known), 0)})")  # fmt: skip

    for run in data["runs"]:
        rounds, factor, start = run["rounds"], run["factor"], run["start"]
        early += sum(1 for r in rounds for k in r["replanned"]["replanned_at"] if k < start)
        delays = ", ".join("-" if r["replan_delay_steps"] is None else str(r["replan_delay_steps"])
                           for r in rounds)  # fmt: skip
        switch = [ms for r in rounds for ms in r["replanned"]["replan_ms"]]
        rows.append([
            f"{factor:g}x", len(rounds),
            f(statistics.median(r["before_ms"] for r in rounds), 0),
            f(statistics.median(r["static"]["after_ms"] for r in rounds), 0),
            f(statistics.median(r["replanned"]["after_ms"] for r in rounds), 0),
            share(rounds, "recovered_step_time"),
            pct((factor - p / (p - 1 + 1 / factor)) / (factor - 1), 0),
            share(rounds, "recovered_throughput"), pct((p - 1) / p, 0), delays,
            f(statistics.median(switch), 0) if switch else "-",
            ", ".join(str(c) for c in sorted({tuple(r["replanned"]["sizes"][-1])
                                              for r in rounds})),
        ])  # fmt: skip
    table = md_table(["rank 1 slow", "rounds", "before ms", "static after ms",
                      "re-planned after ms", "recovered, step time", "ceiling",
                      "recovered, throughput", "ceiling", "re-planned after (steps)",
                      "switch ms", "final cut"], rows)  # fmt: skip
    return (
        f"{table}\n\nMedians over rounds, the range in brackets; {p} gloo ranks. "
        "Re-plans before the straggler began (the first cut's own imbalance, or noise read "
        f"as drift): {early}."
    )


TABLES["pipeline.replan"] = replan_table


# -- plan.md --------------------------------------------------------------------------------


def _config(row: dict) -> str:
    """Blocks per stage and schedule (and recompute, when on) of a pp_plan row."""
    return f"{row['sizes']} {row['schedule']}" + (" + recompute" if row["recompute"] else "")


def _row(rows: list[dict], label: str) -> dict:
    return next(r for r in rows if label in r["labels"])


def plan_table() -> str:
    """``benchmarks/pp_plan.py``: per model, the plan's measured step against the exhaustive
    best, the naive default, ``balance="params"`` and torch's runtime running the plan, with
    the plan's predicted step (medians over the rounds, ms)."""
    data = load("pp_plan.json")
    rows = []
    for model, res in data["models"].items():
        runs = res["rows"]
        plan, naive = _row(runs, "plan"), _row(runs, "naive (split_model) 1f1b")
        params, best = _row(runs, "params 1f1b"), _row(runs, res["exhaustive_best"])
        ms = plan["measured_step_ms"]
        rows.append([
            model, res["blocks"], _config(plan),
            f(ms, 0), f(plan["predicted_step_ms"], 0),
            f"{best['sizes']} {best['schedule']}: {f(best['measured_step_ms'], 0)}",
            times(ms / best["measured_step_ms"]),
            f"{naive['sizes']}: {f(naive['measured_step_ms'], 0)}", times(res["naive_over_plan"]),
            f"{params['sizes']}: {f(params['measured_step_ms'], 0)}",
            f(plan["torch_step_ms"], 0) if "torch_step_ms" in plan else "-",
        ])  # fmt: skip
    headers = ["model", "blocks", "plan (blocks per stage, schedule)", "plan ms", "predicted",
               "exhaustive best, ms", "plan / best", "naive 1F1B, ms", "naive / plan",
               "params 1F1B, ms", "torch runs the plan, ms"]  # fmt: skip
    return md_table(headers, rows, "l" + "r" * (len(headers) - 1))


def plan_prediction_table() -> str:
    """``benchmarks/pp_plan.py``: measured over predicted step time, the plan's rows and the
    median over every configuration run; the memory-limited plan's peak against its limit."""
    data = load("pp_plan.json")
    rows = []
    for model, res in data["models"].items():
        runs = res["rows"]
        plan, limited = _row(runs, "plan"), _row(runs, "memory-limited plan")
        ratios = sorted(r["measured_over_predicted"] for r in runs)
        rows.append([
            model, f(plan["measured_over_predicted"], 2),
            f(limited["measured_over_predicted"], 2), f(statistics.median(ratios), 2),
            f"{f(ratios[0], 2)} to {f(ratios[-1], 2)}",
            _config(limited),
            f"{max(limited['measured_peak_bytes']) / 2**20:.1f} / "
            f"{res['memory_limit_bytes'] / 2**20:.1f}",
        ])  # fmt: skip
    headers = ["model", "plan: measured / predicted", "memory-limited plan: measured / predicted",
               "median, all rows", "range, all rows", "memory-limited plan",
               "its peak / limit, MiB"]  # fmt: skip
    return md_table(headers, rows)


def plan_wider_table() -> str:
    """``benchmarks/pp_plan.py``: the transformer's plan as is and with its last layer's
    feed-forward 3x wider (re-profiled, re-planned)."""
    w = load("pp_plan.json")["wider"]
    rows = [[label, f"{w[label]['sizes']} {w[label]['schedule']}"]
            for label in ("as is", "last layer 3x wider")]  # fmt: skip
    rows.append(["the cut moved", "yes" if w["cut_moved"] else "no"])
    return md_table(["transformer (1F1B, ZB-H1, ZB-2p weighed)", "plan"], rows, "ll")


TABLES["pipeline.plan"] = plan_table
TABLES["pipeline.plan_prediction"] = plan_prediction_table
TABLES["pipeline.plan_wider"] = plan_wider_table
