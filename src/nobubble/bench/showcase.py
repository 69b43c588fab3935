"""``nobubble demo``'s steps that no command shows: each ``step(out_dir, quick, seed)`` prints
what it shows, returns the artifacts it wrote under ``out_dir`` and raises RuntimeError when
a check it makes fails; and :func:`plan_model`, which ``pp plan --model MODULE:FACTORY``
plans in the demo. Heavy imports are inside each function, so ``--help`` loads no torch."""

from __future__ import annotations

import json
import random
import time
from pathlib import Path
from typing import TYPE_CHECKING

from nobubble.bench.output import console, print_table
from nobubble.files import write_text

if TYPE_CHECKING:
    import torch
    from torch import nn

__all__ = ["merge", "moe", "moe_balance", "moe_fastpath", "plan_model", "rank_traces", "replan"]


def merge(out: Path, quick: bool, seed: int) -> list[Path]:
    """``merge_k_lists`` on a small example, then ``kmerge`` of many sorted runs, timed."""
    from nobubble.algorithms.merge import from_list, kmerge, merge_k_lists, to_list

    con = console()
    lists = [[1, 4, 5], [1, 3, 4], [2, 6]]
    merged = to_list(merge_k_lists([from_list(xs) for xs in lists]))
    con.print(f"merge_k_lists({lists}) -> {merged}")
    rng = random.Random(seed)
    k, n = (100, 10_000) if quick else (1000, 200_000)
    runs = [sorted(rng.random() for _ in range(n // k)) for _ in range(k)]
    t0 = time.perf_counter()
    out_list = list(kmerge(*runs))
    dt = time.perf_counter() - t0
    assert out_list == sorted(out_list)
    con.print(f"kmerge of k={k} sorted runs, N={n:,} items: {dt * 1e3:.1f} ms, output sorted: yes")
    return []


def rank_traces(out: Path, quick: bool, seed: int) -> list[Path]:
    """Four ranks' own traces, ``trace/rank{0..3}.json``: each rank starts later than the one
    before (the pipeline fill bubble) and waits a random while between its steps."""
    from nobubble.trace import Event, write_chrome_trace

    rng = random.Random(seed)
    files = []
    for rank in range(4):
        t, events = rank * 150.0, []
        for i in range(8):
            dur = rng.uniform(80, 120)
            events.append(Event(f"step{i}", "compute", rank, t, dur, {"microbatch": i}))
            t += dur + rng.uniform(0, 40)  # waiting for the neighbour
        files.append(write_chrome_trace(out / "trace" / f"rank{rank}.json", events))
    return files


def replan(out: Path, quick: bool, seed: int) -> list[Path]:
    """:func:`nobubble.bench.pp_replan.run_replan` (rank 1 slowed from step 3): each step's
    time and cut, drawn as ``pipeline/replan_steps.png``."""
    from nobubble.bench.pp_replan import ReplanSetup, plot_replan, run_replan

    setup = ReplanSetup(steps=8 if quick else 12, timeout_s=300)
    h = run_replan(setup)
    print_table(
        f"ZB-H1 on 2 ranks, rank 1 {setup.factor:g}x slow from step {setup.start}",
        ["step", "step ms", "layers per rank", "re-planned after it"],
        [[s, f"{ms:.0f}", str(tuple(sizes)), "yes" if s in h.replanned_at else ""]
         for s, (ms, sizes) in enumerate(zip(h.step_ms, h.sizes, strict=True))],
    )  # fmt: skip
    return [plot_replan(h, setup, out / "pipeline" / "replan_steps.png")]


def moe(out: Path, quick: bool, seed: int) -> list[Path]:
    """:func:`nobubble.bench.ep_layer.run_layer_check` on 4 gloo ranks (2 with ``quick``):
    writes ``moe/load_balance.png`` and ``moe/ep_demo.json``."""
    from nobubble.bench.ep_layer import plot_loads, run_layer_check

    ranks, num_tokens, steps = (2, 64, 12) if quick else (4, 256, 40)
    con = console()
    con.print(f"MoE layer (DeepSeek-V3 routing, 16 experts, top-4) on {ranks} gloo ranks")
    check = run_layer_check(ranks, num_tokens, steps, timeout_s=600)
    print_table(
        "dispatch on the first step",
        ["rank", "rows sent per rank", "rows received per rank", "buffer bytes", "per-pair bytes"],
        [[r, str(check.sent_rows[r]), str(check.recv_rows[r]), check.buffer_bytes[r],
          check.pair_bytes[r]] for r in range(ranks)],
    )  # fmt: skip
    s = check.summary()
    con.print(
        f"dispatch moved {s['buffer_bytes']:,} B vs {s['per_pair_bytes']:,} B for a per-pair "
        f"all-to-all ({s['per_pair_bytes'] / s['buffer_bytes']:.2f}x); vs the token-by-token "
        f"reference MoE: max relative diff: output {s['max_rel_output_diff']:.1e}, "
        f"input/router grads {s['max_rel_grad_diff']:.1e}\n"
        f"expert load max/mean: step 1 {s['imbalance'][0]:.2f} -> step {steps} "
        f"{s['imbalance'][-1]:.2f} (bias updated by rate * sign(mean - load) after each step)"
    )
    png = plot_loads(check.loads, out / "moe" / "load_balance.png")
    summary = _write_json(out / "moe" / "ep_demo.json", s)
    if max(s["max_rel_output_diff"], s["max_rel_grad_diff"]) > 1e-5:
        raise RuntimeError(f"MoE layer disagrees with the reference MoE: {s}")
    return [png, summary]


def moe_fastpath(out: Path, quick: bool, seed: int) -> list[Path]:
    """DeepEP's mechanisms on 4 gloo ranks beside their baselines
    (:mod:`nobubble.bench.ep_fastpath`): writes ``moe/fastpaths.json`` and
    ``moe/ep_overlap_timeline.png``."""
    from dataclasses import replace

    from nobubble.bench import ep_fastpath as fp
    from nobubble.bench import ep_tables
    from nobubble.moe.layer import MoEConfig

    shape = (
        fp.Shape(ranks=4, tokens=256, hidden=512, experts=32, topk=4, iters=2)
        if quick
        else fp.Shape(ranks=4, tokens=1024, hidden=2048, experts=64, topk=8, iters=3)
    )
    con = console()
    con.print(
        f"MoE fast paths on {shape.ranks} gloo ranks: {shape.tokens} x {shape.hidden} bf16 tokens "
        f"per rank, top-{shape.topk} of {shape.experts} experts (CPU; shared memory is this "
        "host's NVLink)"
    )
    # overlap pays off only when a chunk's experts take longer than its fixed costs
    config = MoEConfig(hidden=512 if quick else 2048, expert_hidden=128 if quick else 256,
                       num_experts=16, topk=4)  # fmt: skip
    picture = out / "moe" / "ep_overlap_timeline.png"
    res = {"transports": fp.run_transports(shape, fp.memcpy_gbps(64 << 20))}
    ep_tables.print_transports(res["transports"])
    res["hierarchical"] = fp.run_hierarchical(replace(shape, tokens=shape.tokens // 2))
    ep_tables.print_hierarchical(res["hierarchical"])
    res["low_latency"] = fp.run_low_latency(replace(shape, tokens=32, iters=4))
    ep_tables.print_low_latency(res["low_latency"])
    res["overlap"] = fp.run_overlap(256 if quick else 1024, config, iters=2 if quick else 3,
                                    picture=picture)  # fmt: skip
    ep_tables.print_overlap(res["overlap"])
    summary = _write_json(out / "moe" / "fastpaths.json", res)
    if problems := fp.fastpath_problems(res):
        raise RuntimeError("MoE fast paths: " + "; ".join(problems))
    return [summary, picture]


def moe_balance(out: Path, quick: bool, seed: int) -> list[Path]:
    """EPLB's published example, a DeepSeek-V3-like placement and a rebalance after drift
    (:func:`~nobubble.moe.balance.report.eplb_tour`). Writes ``moe/eplb_placement.png`` and
    ``moe/eplb_demo.json``."""
    from nobubble.moe.balance.report import eplb_tour, plot_balance

    con = console()
    layers = 2 if quick else 8
    s, report = eplb_tour(layers)
    con.print("EPLB published example (12 experts, 16 replicas, 8 GPUs): identical to EPLB: "
              f"{s['eplb_example_identical']}")  # fmt: skip
    con.print(
        f"DeepSeek-V3-like (256 experts + 32 redundant, 32 GPUs / 4 nodes, Pareto(2) loads, "
        f"{layers} layers): max/mean GPU load {s['imbalance_before']:.2f} -> "
        f"{s['imbalance_after']:.3f}; GPUs holding an expert twice, over all layers: "
        f"{s['duplicate_gpus']} (EPLB: {s['eplb_duplicate_gpus']})"
    )
    con.print(
        f"after a 20% drift: incremental rebalance moves {s['moved_incremental']:.0f} of 288 "
        f"experts per layer (fresh: {s['moved_fresh']:.0f}) at max/mean "
        f"{s['imbalance_incremental']:.3f} (fresh {s['imbalance_fresh']:.3f})"
    )
    png = plot_balance(report, out / "moe" / "eplb_placement.png")
    return [png, _write_json(out / "moe" / "eplb_demo.json", s)]


def _write_json(path: Path, data: dict) -> Path:
    return write_text(path, json.dumps(data, indent=2) + "\n")


def plan_model() -> tuple[list[nn.Module], torch.Tensor, torch.Tensor, object]:
    """``(blocks, inputs, targets, loss_fn)``: an embedding, four ``nn.TransformerEncoderLayer``
    blocks and a head (width 64), a batch of 16 x 32 token ids and next-token cross entropy."""
    import torch
    from torch import nn

    vocab, width, batch, seq = 256, 64, 16, 32
    layers = [nn.TransformerEncoderLayer(width, 4, 4 * width, dropout=0.0, batch_first=True)
              for _ in range(4)]  # fmt: skip
    ids = torch.randint(0, vocab, (batch, seq + 1), generator=torch.Generator().manual_seed(1))
    blocks = [nn.Embedding(vocab, width), *layers, nn.Linear(width, vocab)]
    return blocks, ids[:, :-1], ids[:, 1:], _next_token_loss  # (B, T) inputs, next tokens


def _next_token_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Next-token cross entropy: logits ``(B, T, V)``, targets ``(B, T)``."""
    from torch import nn

    return nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
