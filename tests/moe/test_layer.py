"""MoELayer on 2 and 4 gloo ranks equals the dense single-process MoE (outputs and gradients)."""

from __future__ import annotations

import pytest
import torch

from nobubble.distributed import spawn
from nobubble.moe import Buffer, DenseMoE, MoEConfig, MoELayer, init_moe_weights

CONFIGS = [
    MoEConfig(hidden=12, expert_hidden=8, num_experts=8, topk=2, num_shared_experts=1),
    MoEConfig(
        hidden=12,
        expert_hidden=6,
        num_experts=8,
        topk=3,
        num_shared_experts=2,
        router="deepseek_v3",
        n_groups=4,
        topk_groups=2,
        route_scale=2.5,
        bias_update_rate=0.01,
    ),
]
TOKENS = (5, 0, 7, 3)  # rank 1 has no tokens at all


def _layer_body(ctx, xs, gs):
    out = []
    for ci, config in enumerate(CONFIGS):
        layer = MoELayer(config, init_moe_weights(config, seed=ci), Buffer(timeout_s=60))
        x = xs[ctx.rank].clone().requires_grad_()
        y = layer(x)
        (y * gs[ctx.rank]).sum().backward()
        grads = {name: p.grad.clone() for name, p in layer.named_parameters()}
        out.append(
            {
                "y": y.detach(),
                "x_grad": x.grad,
                "grads": grads,
                "load": layer.last_tokens_per_expert.clone(),
                "bias": layer.update_expert_bias().clone(),
            }
        )
    return out


@pytest.mark.parametrize("world_size", [2, 4])
def test_layer_matches_dense(world_size):
    g = torch.Generator().manual_seed(world_size)
    hidden = CONFIGS[0].hidden
    xs = [torch.randn(TOKENS[r], hidden, generator=g) for r in range(world_size)]
    gs = [torch.randn(TOKENS[r], hidden, generator=g) for r in range(world_size)]
    results = spawn(_layer_body, world_size, args=(xs, gs), timeout_s=240)
    close = {"rtol": 1e-5, "atol": 1e-6}
    for ci, config in enumerate(CONFIGS):
        dense = DenseMoE(config, init_moe_weights(config, seed=ci))
        x = torch.cat(xs).requires_grad_()
        y = dense(x)
        (y * torch.cat(gs)).sum().backward()
        per_rank = [r[ci] for r in results]
        torch.testing.assert_close(torch.cat([r["y"] for r in per_rank]), y.detach(), **close)
        torch.testing.assert_close(torch.cat([r["x_grad"] for r in per_rank]), x.grad, **close)
        dense_grads = dict(dense.named_parameters())
        # replicated weights (router, shared experts): the ranks' gradients sum to the dense one
        for name in [n for n in per_rank[0]["grads"] if not n.startswith("w_")]:
            total = sum(r["grads"][name] for r in per_rank)
            torch.testing.assert_close(total, dense_grads[name].grad, **close, msg=name)
        assert dense_grads["router"].grad.abs().sum() > 0  # the router does learn through dispatch
        # routed experts: each rank holds a contiguous slice
        for name in ("w_gate", "w_up", "w_down"):
            local = torch.cat([r["grads"][name] for r in per_rank])
            torch.testing.assert_close(local, dense_grads[name].grad, **close, msg=name)
        dense_bias = dense.update_expert_bias()
        for r in per_rank:
            assert torch.equal(r["load"], dense.last_tokens_per_expert)
            torch.testing.assert_close(r["bias"], dense_bias)
