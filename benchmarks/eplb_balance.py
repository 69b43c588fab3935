"""EPLB on a DeepSeek-V3-like deployment: balance, duplicates, moves, time - vs EPLB itself.

256 logical experts in 8 groups, 4 nodes x 8 GPUs, 32 redundant experts (288 physical, 9 per
GPU), heavy-tailed loads (Zipf and Pareto popularity, experts shuffled per layer). Baselines
in the same run: no redundancy (each expert once, in order) and a faithful transcription of
deepseek-ai/EPLB (``nobubble.moe.balance.eplb_reference``). Then loads drift (each expert's load
times a log-normal factor) and a fresh rebalance is compared with the incremental one, once
and over a sequence of periodic rebalances.

    python -m benchmarks.eplb_balance [--quick]

Writes ``benchmarks/results/eplb_balance[_quick].json`` and ``docs/img/eplb_*.png``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import torch
from rich.progress import Progress

from benchmarks._common import time_interleaved, write_json
from benchmarks.records.eplb_balance import EplbBalance
from nobubble.bench.output import print_table
from nobubble.moe.balance.eplb import gpu_loads, load_imbalance, rebalance_experts
from nobubble.moe.balance.eplb_reference import reference_rebalance_experts
from nobubble.moe.balance.incremental import (
    count_moves,
    rebalance_experts_incremental,
)

E, GROUPS, NODES, GPUS, REDUNDANT = 256, 8, 4, 32, 32
R = E + REDUNDANT
SKEWS = [("zipf", 1.0), ("zipf", 1.2), ("pareto", 1.5), ("pareto", 2.0), ("pareto", 3.0)]
IMG = Path(__file__).resolve().parent.parent / "docs" / "img"


def loads(kind: str, param: float, num_layers: int, seed: int) -> torch.Tensor:
    rng = np.random.default_rng(seed)
    rows = []
    for _ in range(num_layers):
        if kind == "zipf":
            pop = rng.permutation(1.0 / np.arange(1, E + 1) ** param)
        else:
            pop = rng.pareto(param, E) + 1.0
        rows.append(pop / pop.sum() * 65536)  # tokens x top-8 per layer, ~8k tokens
    return torch.tensor(np.stack(rows))


def duplicates(phy2log: torch.Tensor) -> torch.Tensor:
    srt = phy2log.view(phy2log.shape[0], GPUS, -1).sort(-1).values
    return (srt[..., 1:] == srt[..., :-1]).any(-1).sum(-1)


def static_balance(num_layers: int, repeats: int, progress) -> list[dict]:
    rows = []
    task = progress.add_task("balance", total=len(SKEWS))
    for kind, param in SKEWS:
        w = loads(kind, param, num_layers, seed=1)
        ours = rebalance_experts(w, R, GROUPS, NODES, GPUS)
        ref, _, _ = reference_rebalance_experts(w, R, GROUPS, NODES, GPUS)
        none = load_imbalance(w.view(num_layers, GPUS, -1).sum(-1))
        ref_imb = load_imbalance(gpu_loads(w, ref, GPUS))
        one = w[:1]
        t = time_interleaved(
            {
                "ours": lambda one=one: rebalance_experts(one, R, GROUPS, NODES, GPUS),
                "eplb": lambda one=one: reference_rebalance_experts(one, R, GROUPS, NODES, GPUS),
            },
            repeats,
        )
        rows.append(
            {
                "skew": f"{kind}:{param:g}",
                "imbalance_none": float(none.mean()),
                "imbalance_eplb": float(ref_imb.mean()),
                "imbalance_ours": float(ours.imbalance(w).mean()),
                "worst_layer_eplb": float(ref_imb.max()),
                "worst_layer_ours": float(ours.imbalance(w).max()),
                "dup_gpus_per_layer_eplb": float(duplicates(ref).float().mean()),
                "dup_gpus_per_layer_ours": float(duplicates(ours.phy2log).float().mean()),
                "ms_per_layer_eplb": t["eplb"] * 1e3,
                "ms_per_layer_ours": t["ours"] * 1e3,
            }
        )
        progress.advance(task)
    return rows


def drift(w: torch.Tensor, sigma: float, seed: int) -> torch.Tensor:
    rng = np.random.default_rng(seed)
    return w * torch.tensor(rng.lognormal(0.0, sigma, tuple(w.shape)))


def incremental_once(num_layers: int, progress) -> list[dict]:
    rows = []
    w0 = loads("pareto", 2.0, num_layers, seed=2)
    current = rebalance_experts(w0, R, GROUPS, NODES, GPUS)
    ref0, _, _ = reference_rebalance_experts(w0, R, GROUPS, NODES, GPUS)
    sigmas = (0.1, 0.3, 0.6)
    task = progress.add_task("incremental", total=len(sigmas))
    for sigma in sigmas:
        w1 = drift(w0, sigma, seed=3)
        inc = rebalance_experts_incremental(w1, current.phy2log, GROUPS, NODES, GPUS)
        ref1, _, _ = reference_rebalance_experts(w1, R, GROUPS, NODES, GPUS)
        rows.append(
            {
                "drift_sigma": sigma,
                "imbalance_stale": float(current.imbalance(w1).mean()),
                "imbalance_fresh": float(inc.fresh_imbalance.mean()),
                "imbalance_incremental": float(inc.imbalance.mean()),
                "moved_fresh": float(inc.num_moved_fresh.float().mean()),
                "moved_incremental": float(inc.num_moved.float().mean()),
                "moved_eplb_fresh": float(count_moves(ref0, ref1, GPUS).float().mean()),
            }
        )
        progress.advance(task)
    return rows


def periodic(num_layers: int, periods: int, progress) -> dict:
    """Rebalance every period under a random-walk drift (sigma 0.2 per period)."""
    w = loads("pareto", 2.0, num_layers, seed=4)
    fresh = inc = rebalance_experts(w, R, GROUPS, NODES, GPUS).phy2log
    out = {"moved_fresh": [], "moved_incremental": [], "imb_fresh": [], "imb_incremental": []}
    task = progress.add_task("periodic", total=periods)
    for period in range(periods):
        w = drift(w, 0.2, seed=10 + period)
        new_fresh = rebalance_experts(w, R, GROUPS, NODES, GPUS).phy2log
        res = rebalance_experts_incremental(w, inc, GROUPS, NODES, GPUS)
        out["moved_fresh"].append(float(count_moves(fresh, new_fresh, GPUS).float().mean()))
        out["moved_incremental"].append(float(res.num_moved.float().mean()))
        out["imb_fresh"].append(float(load_imbalance(gpu_loads(w, new_fresh, GPUS)).mean()))
        out["imb_incremental"].append(float(res.imbalance.mean()))
        fresh, inc = new_fresh, res.placement.phy2log
        progress.advance(task)
    return out


ONLINE = {"hidden": 256, "expert_hidden": 512, "experts": 16, "physical": 24, "ranks": 4}


def online_rank(ctx, rounds: int) -> list[dict]:
    """Two identical replicated layers; one rebalances fresh, one incrementally, same loads."""
    import time

    from nobubble.moe.balance.online import rebalance_online
    from nobubble.moe.balance.replicated_layer import EXPERT_PARAMS, ReplicatedMoELayer
    from nobubble.moe.buffer import Buffer
    from nobubble.moe.layer import MoEConfig, init_moe_weights

    cfg = MoEConfig(hidden=ONLINE["hidden"], expert_hidden=ONLINE["expert_hidden"],
                    num_experts=ONLINE["experts"], topk=2)  # fmt: skip
    weights = init_moe_weights(cfg, seed=0)
    rng = np.random.default_rng(5)
    w = torch.tensor(rng.pareto(2.0, (1, ONLINE["experts"])) + 1.0)
    start = rebalance_experts(w, ONLINE["physical"], 1, 1, ONLINE["ranks"]).phy2log[0]
    buffer = Buffer(timeout_s=ctx.timeout_s)
    layers = {m: ReplicatedMoELayer(cfg, weights, buffer, start) for m in ("fresh", "incremental")}
    opts = {}
    for m, layer in layers.items():  # one Adam step so that there is optimizer state to move
        params = [getattr(layer, n) for n in EXPERT_PARAMS]
        for p in params:
            p.grad = torch.ones_like(p)
        opts[m] = torch.optim.Adam(params)
        opts[m].step()
    rows = []
    for r in range(rounds):
        w = drift(w, 0.3, seed=20 + r)
        for m, layer in layers.items():
            torch.distributed.barrier()
            t0 = time.perf_counter()
            res = rebalance_online(layer, opts[m], incremental=m == "incremental", weight=w[0])
            rows.append({"round": r, "mode": m, "moved": res.num_moved, "bytes": res.bytes_moved,
                         "ms": (time.perf_counter() - t0) * 1e3,
                         "imbalance_before": res.imbalance_before,
                         "imbalance_after": res.imbalance_after})  # fmt: skip
    return rows


def online(rounds: int) -> list[dict]:
    from nobubble.distributed import spawn

    by_rank = spawn(online_rank, ONLINE["ranks"], args=(rounds,), timeout_s=600)
    out = []
    for mode in ("fresh", "incremental"):
        rows = [[r for r in ranks if r["mode"] == mode] for ranks in by_rank]
        per_round = list(zip(*rows))  # (rounds, ranks)
        out.append(
            {
                "mode": mode,
                "moved_per_rebalance": float(np.mean([rr[0]["moved"] for rr in per_round])),
                "mb_sent_per_rebalance": float(
                    np.mean([sum(x["bytes"] for x in rr) for rr in per_round]) / 2**20
                ),
                "ms_median": float(np.median([max(x["ms"] for x in rr) for rr in per_round])),
                "imbalance_after": float(np.mean([rr[0]["imbalance_after"] for rr in per_round])),
                "imbalance_stale": float(np.mean([rr[0]["imbalance_before"] for rr in per_round])),
            }
        )
    return out


def plot(static: list[dict], per: dict, suffix: str) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    IMG.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(7, 3.4))
    x = np.arange(len(static))
    for i, (key, label) in enumerate(
        [("imbalance_none", "no redundancy"), ("imbalance_eplb", "EPLB (original)"),
         ("imbalance_ours", "nobubble (no duplicates)")]
    ):  # fmt: skip
        ax.bar(x + (i - 1) * 0.27, [r[key] for r in static], 0.27, label=label)
    ax.set_xticks(x, [r["skew"] for r in static])
    ax.set_ylabel("max / mean GPU load")
    ax.axhline(1.0, color="k", lw=0.6)
    ax.set_title("256 experts + 32 redundant on 32 GPUs / 4 nodes (hierarchical)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    a = IMG / f"eplb_balance{suffix}.png"
    fig.savefig(a)
    plt.close(fig)
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(9, 3.2))
    steps = range(1, len(per["moved_fresh"]) + 1)
    ax1.plot(steps, per["moved_fresh"], "o-", label="fresh rebalance")
    ax1.plot(steps, per["moved_incremental"], "s-", label="incremental")
    ax1.set_xlabel("rebalance #")
    ax1.set_ylabel("experts moved per layer (of 288)")
    ax1.legend(fontsize=8)
    ax2.plot(steps, per["imb_fresh"], "o-", label="fresh")
    ax2.plot(steps, per["imb_incremental"], "s-", label="incremental (tolerance 0.02)")
    ax2.set_xlabel("rebalance #")
    ax2.set_ylabel("max / mean GPU load")
    ax2.legend(fontsize=8)
    fig.suptitle("periodic rebalancing under drifting Pareto(2) loads")
    fig.tight_layout()
    b = IMG / f"eplb_moves{suffix}.png"
    fig.savefig(b)
    plt.close(fig)
    return [a, b]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="4 layers, fewer repeats")
    args = parser.parse_args()
    layers, repeats, periods = (4, 3, 4) if args.quick else (16, 7, 10)
    with Progress(transient=True, console=None) as progress:
        static = static_balance(layers, repeats, progress)
        once = incremental_once(layers, progress)
        per = periodic(layers, periods, progress)
        task = progress.add_task("online (4 gloo ranks)", total=None)
        live = online(3 if args.quick else 6)
        progress.remove_task(task)
    print_table(
        f"balance, mean over {layers} layers (worst layer in brackets)",
        ["loads", "none", "EPLB", "nobubble", "EPLB dup GPUs/layer", "ours dup", "EPLB ms", "ours ms"],
        [
            [r["skew"], r["imbalance_none"], f"{r['imbalance_eplb']:.3f} ({r['worst_layer_eplb']:.3f})",
             f"{r['imbalance_ours']:.3f} ({r['worst_layer_ours']:.3f})", r["dup_gpus_per_layer_eplb"],
             r["dup_gpus_per_layer_ours"], r["ms_per_layer_eplb"], r["ms_per_layer_ours"]]
            for r in static
        ],
    )  # fmt: skip
    print_table(
        "one rebalance after drift, Pareto(2) loads (moved = physical experts copied, of 288)",
        ["drift sigma", "stale", "fresh", "incremental", "moved fresh", "moved incr.", "moved EPLB"],
        [
            [r["drift_sigma"], r["imbalance_stale"], r["imbalance_fresh"], r["imbalance_incremental"],
             r["moved_fresh"], r["moved_incremental"], r["moved_eplb_fresh"]]
            for r in once
        ],
    )  # fmt: skip
    print_table(
        f"{periods} periodic rebalances (drift sigma 0.2 each)",
        ["", "moved / layer / rebalance", "mean max/mean"],
        [
            ["fresh", float(np.mean(per["moved_fresh"])), float(np.mean(per["imb_fresh"]))],
            ["incremental", float(np.mean(per["moved_incremental"])),
             float(np.mean(per["imb_incremental"]))],
        ],
    )  # fmt: skip
    print_table(
        f"online rebalance on {ONLINE['ranks']} gloo ranks: {ONLINE['experts']} experts -> "
        f"{ONLINE['physical']} physical, H={ONLINE['hidden']}, I={ONLINE['expert_hidden']}, "
        "weights + Adam state, drift sigma 0.3 per round",
        ["mode", "moved / rebalance", "MiB sent (all ranks)", "ms (median, slowest rank)",
         "max/mean stale", "max/mean after"],
        [[r["mode"], r["moved_per_rebalance"], r["mb_sent_per_rebalance"], r["ms_median"],
          r["imbalance_stale"], r["imbalance_after"]] for r in live],
    )  # fmt: skip
    suffix = "_quick" if args.quick else ""
    images = plot(static, per, suffix)
    path = write_json(
        f"eplb_balance{suffix}",
        EplbBalance,
        {
            "config": {"experts": E, "groups": GROUPS, "nodes": NODES, "gpus": GPUS,
                       "redundant": REDUNDANT, "layers": layers},
            "balance": static,
            "incremental_once": once,
            "periodic": per,
            "online": {"config": ONLINE, "results": live},
            "images": [str(p) for p in images],
        },
    )  # fmt: skip
    print(f"wrote {path} and {', '.join(str(p) for p in images)}")


if __name__ == "__main__":
    main()
