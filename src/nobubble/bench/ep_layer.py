"""``nobubble demo``'s expert-parallel step: a DeepSeek-V3-routed
:class:`~nobubble.moe.layer.MoELayer` through :class:`~nobubble.moe.buffer.Buffer` on local
gloo ranks, checked against :class:`~nobubble.moe.reference_layer.ReferenceMoE` (output and
gradients), its dispatch bytes beside a per-pair all-to-all, then aux-loss-free bias updates on
a skewed token stream (experts 0-2 favoured).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from nobubble.distributed import spawn
from nobubble.files import figure
from nobubble.moe.balance.eplb import load_imbalance
from nobubble.moe.baseline import pair_dispatch
from nobubble.moe.buffer import Buffer
from nobubble.moe.layer import MoEConfig, MoELayer, init_moe_weights
from nobubble.moe.reference_layer import ReferenceMoE

__all__ = ["LayerCheck", "run_layer_check", "plot_loads"]


@dataclass(frozen=True)
class LayerCheck:
    """What :func:`run_layer_check` measured."""

    sent_rows: list[list[int]]
    """Per rank: rows its first dispatch sent to each rank."""
    recv_rows: list[list[int]]
    """Per rank: rows its first dispatch received from each rank."""
    buffer_bytes: list[int]
    """Per rank: bytes Buffer's dispatch sent."""
    pair_bytes: list[int]
    """Per rank: bytes a per-pair all-to-all sends for the same routing."""
    loads: list[list[int]]
    """Rank 0's tokens per expert at every bias-updated step, ``(steps, E)``."""
    max_rel_output_diff: float
    """Largest relative difference of the first step's output to the reference MoE."""
    max_rel_grad_diff: float
    """Largest relative difference of the input and router gradients to the reference's."""

    @property
    def imbalance(self) -> list[float]:
        """Max / mean expert load at every step of :attr:`loads` (:func:`load_imbalance`)."""
        return load_imbalance(torch.tensor(self.loads)).tolist()

    def summary(self) -> dict[str, Any]:
        """The headline figures (``nobubble demo`` writes them as ``moe/ep_demo.json``):
        bytes summed over ranks, the largest differences to the reference, the imbalance."""
        return {
            "ranks": len(self.buffer_bytes),
            "buffer_bytes": sum(self.buffer_bytes),
            "per_pair_bytes": sum(self.pair_bytes),
            "max_rel_output_diff": self.max_rel_output_diff,
            "max_rel_grad_diff": self.max_rel_grad_diff,
            "imbalance": self.imbalance,
        }


def run_layer_check(num_ranks: int, num_tokens: int, steps: int, *,
                    timeout_s: float = 600) -> LayerCheck:  # fmt: skip
    """Spawn ``num_ranks`` gloo ranks with ``num_tokens`` tokens each; a first step with
    gradients, then ``steps`` bias-updated steps (see the module)."""
    results = spawn(_rank, num_ranks, args=(num_tokens, steps), timeout_s=timeout_s)
    out_err, grad_err = _reference_check(results)
    per_rank = ("sent_rows", "recv_rows", "buffer_bytes", "pair_bytes")
    return LayerCheck(
        **{name: [r[name] for r in results] for name in per_rank},
        loads=results[0]["loads"],
        max_rel_output_diff=out_err,
        max_rel_grad_diff=grad_err,
    )


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
    """One rank: a first step with gradients, its dispatch bytes beside a per-pair all-to-all,
    then ``steps`` bias-updated steps on the skewed stream."""
    config = _config()
    buf = Buffer(transport="dist", timeout_s=120)  # gloo collectives, as the bench's default
    layer = MoELayer(config, _weights(config), buf)
    g = torch.Generator().manual_seed(ctx.rank)
    x0 = _skewed_tokens(num_tokens, config.hidden, g).requires_grad_()
    y0 = layer(x0)
    y0.square().sum().backward()
    x, topk_idx = x0.detach(), layer.route(x0.detach()).topk_idx
    buf.transport.reset_stats()
    res = buf.dispatch(x, topk_idx, num_experts=config.num_experts)
    buffer_bytes = buf.transport.stats().bytes_sent["x"]
    buf.transport.reset_stats()
    pair_dispatch(x, topk_idx, None, config.num_experts, buf.transport)
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


def plot_loads(loads: list[list[int]], path: Path) -> Path:
    """Draw max / mean expert load against step and the per-expert load at the first and last
    step (``loads``: ``(steps, E)`` tokens per expert)."""
    t = torch.tensor(loads, dtype=torch.float64)  # (steps, E)
    imbalance = (t.max(dim=1).values / t.mean(dim=1)).tolist()
    with figure(path, 1, 2, figsize=(10, 3.6)) as (_, (ax1, ax2)):
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
    return path
