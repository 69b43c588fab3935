"""``nobubble demo`` step for MoE expert parallelism.

Four local ranks (two with ``quick``) run a DeepSeek-V3-routed :class:`MoELayer` through
:class:`Buffer`: the first step's output and gradients are checked against the token-by-token
reference MoE in one process (:class:`~nobubble.moe.reference_layer.ReferenceMoE`), the bytes
dispatch moves are compared with a per-pair all-to-all, and
the auxiliary-loss-free bias is updated after every step on a skewed token stream, which
flattens the expert load. Writes ``moe/load_balance.png`` and ``moe/ep_demo.json``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from nobubble.cli.util import console, print_table
from nobubble.distributed import spawn
from nobubble.files import save_figure, write_text
from nobubble.moe.baseline import pair_dispatch
from nobubble.moe.buffer import Buffer
from nobubble.moe.layer import MoEConfig, MoELayer, init_moe_weights
from nobubble.moe.reference_layer import ReferenceMoE

__all__ = ["run"]


def _config() -> MoEConfig:
    return MoEConfig(
        hidden=32,
        expert_hidden=16,
        num_experts=16,
        topk=4,
        num_shared_experts=1,
        router="deepseek_v3",
        n_groups=4,
        topk_groups=2,
        route_scale=2.5,
        bias_update_rate=0.02,
    )


def _skewed_tokens(num_tokens: int, hidden: int, g: torch.Generator) -> torch.Tensor:
    """Tokens that share a common direction: the router's favourite experts get most of them."""
    common = torch.ones(hidden) / hidden**0.5
    return torch.randn(num_tokens, hidden, generator=g) + 3.0 * common


def _weights(config: MoEConfig):
    w = init_moe_weights(config, seed=7)
    common = torch.ones(config.hidden) / config.hidden**0.5
    w.router[:3] += 1.5 * common  # experts 0-2 like the common direction
    return w


def _rank(ctx, num_tokens: int, steps: int) -> dict[str, Any]:
    config = _config()
    buf = Buffer(transport="dist", timeout_s=120)  # gloo collectives, as the bench's default
    layer = MoELayer(config, _weights(config), buf)
    g = torch.Generator().manual_seed(ctx.rank)
    x0 = _skewed_tokens(num_tokens, config.hidden, g).requires_grad_()
    y0 = layer(x0)
    y0.square().sum().backward()
    buf.transport.reset_stats()
    res = buf.dispatch(
        x0.detach(), layer.route(x0.detach()).topk_idx, num_experts=config.num_experts
    )
    buffer_bytes = buf.transport.stats().bytes_sent["x"]
    buf.transport.reset_stats()
    pair_dispatch(
        x0.detach(), layer.route(x0.detach()).topk_idx, None, config.num_experts, buf.transport
    )
    pair_bytes = buf.transport.stats().bytes_sent["x"]
    loads = []
    with torch.no_grad():
        for _ in range(steps):
            layer(_skewed_tokens(num_tokens, config.hidden, g))
            assert layer.last_tokens_per_expert is not None  # set by the forward
            loads.append(layer.last_tokens_per_expert.tolist())
            layer.update_expert_bias()
    assert layer.router is not None  # built from weights
    return {
        "x0": x0.detach(),
        "y0": y0.detach(),
        "x0_grad": x0.grad,
        "router_grad": layer.router.grad,
        "sent_rows": list(res.handle.num_send_tokens_per_rank),
        "recv_rows": list(res.handle.num_recv_tokens_per_rank),
        "buffer_bytes": buffer_bytes,
        "pair_bytes": pair_bytes,
        "loads": loads,
    }


def _rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    return ((got - want).abs().max() / want.abs().max().clamp_min(1e-30)).item()


def _reference_check(results: list[dict[str, Any]]) -> tuple[float, float]:
    """Largest relative difference to the reference MoE: (output, gradients of input and
    router)."""
    config = _config()
    reference = ReferenceMoE(config, _weights(config))
    x = torch.cat([r["x0"] for r in results]).requires_grad_()
    y = reference(x)
    y.square().sum().backward()
    out_err = _rel_err(torch.cat([r["y0"] for r in results]), y.detach())
    router = reference.router
    assert x.grad is not None and router.grad is not None
    grad_err = max(
        _rel_err(torch.cat([r["x0_grad"] for r in results]), x.grad),
        _rel_err(sum(r["router_grad"] for r in results), router.grad),
    )
    return out_err, grad_err


def _plot(loads: list[list[int]], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t = torch.tensor(loads, dtype=torch.float64)  # (steps, E)
    imbalance = (t.max(dim=1).values / t.mean(dim=1)).tolist()
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.6))
    ax1.plot(range(1, len(imbalance) + 1), imbalance, marker=".")
    ax1.set_xlabel("step")
    ax1.set_ylabel("max / mean expert load")
    ax1.set_title("aux-loss-free bias update")
    e = list(range(t.shape[1]))
    ax2.bar([i - 0.2 for i in e], t[0].tolist(), width=0.4, label="step 1")
    ax2.bar([i + 0.2 for i in e], t[-1].tolist(), width=0.4, label=f"step {len(loads)}")
    ax2.set_xlabel("expert")
    ax2.set_ylabel("tokens")
    ax2.legend()
    ax2.set_title("per-expert load")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    save_figure(fig, path, dpi=110)
    plt.close(fig)
    return path


def run(out_dir: Path, quick: bool) -> list[Path]:
    """Run the MoE showcase; returns the artifacts written under ``out_dir``."""
    ranks, num_tokens, steps = (2, 64, 12) if quick else (4, 256, 40)
    con = console()
    con.print(f"MoE layer (DeepSeek-V3 routing, 16 experts, top-4) on {ranks} gloo ranks")
    results = spawn(_rank, ranks, args=(num_tokens, steps), timeout_s=600)
    out_err, grad_err = _reference_check(results)
    print_table(
        "dispatch on the first step",
        ["rank", "rows sent per rank", "rows received per rank", "buffer bytes", "per-pair bytes"],
        [
            [
                r,
                str(res["sent_rows"]),
                str(res["recv_rows"]),
                res["buffer_bytes"],
                res["pair_bytes"],
            ]
            for r, res in enumerate(results)
        ],
    )
    total_buffer = sum(r["buffer_bytes"] for r in results)
    total_pair = sum(r["pair_bytes"] for r in results)
    con.print(
        f"dispatch moved {total_buffer:,} B vs {total_pair:,} B for a per-pair all-to-all "
        f"({total_pair / total_buffer:.2f}x); vs the token-by-token reference MoE: "
        f"max relative diff: output {out_err:.1e}, input/router grads {grad_err:.1e}"
    )
    loads = results[0]["loads"]
    imbalance = [max(step) / (sum(step) / len(step)) for step in loads]
    con.print(
        f"expert load max/mean: step 1 {imbalance[0]:.2f} -> step {steps} {imbalance[-1]:.2f} "
        "(bias updated by rate * sign(mean - load) after each step)"
    )
    png = _plot(loads, out_dir / "moe" / "load_balance.png")
    summary = out_dir / "moe" / "ep_demo.json"
    write_text(
        summary,
        json.dumps(
            {
                "ranks": ranks,
                "buffer_bytes": total_buffer,
                "per_pair_bytes": total_pair,
                "max_rel_output_diff": out_err,
                "max_rel_grad_diff": grad_err,
                "imbalance": imbalance,
            },
            indent=2,
        )
        + "\n",
    )
    if out_err > 1e-5 or grad_err > 1e-5:
        raise RuntimeError(f"MoE layer disagrees with the reference MoE ({out_err}, {grad_err})")
    return [png, summary]
