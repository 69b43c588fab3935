"""MoELayer on 2 and 4 gloo ranks equals the token-by-token reference MoE on all ranks' tokens
in one process (``nobubble.moe.reference_layer``, no code shared): outputs, every gradient,
loads and the bias update. Float64 throughout (the routers score in the logits' dtype): the
routed parts agree to 1e-10, the shared experts' gradients to 1e-12."""

from __future__ import annotations

import pytest
import torch

from nobubble.distributed import spawn
from nobubble.moe import Buffer, MoEConfig, MoELayer, ReferenceMoE, init_moe_weights

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
F64 = torch.float64
SHARED = {"shared.0": "shared_gate", "shared.1": "shared_up", "shared.2": "shared_down"}


def _layer_body(ctx, xs, gs):
    out = []
    for ci, config in enumerate(CONFIGS):
        weights = init_moe_weights(config, seed=ci, dtype=F64)
        layer = MoELayer(config, weights, Buffer(timeout_s=60))
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
def test_layer_matches_the_reference(world_size):
    g = torch.Generator().manual_seed(world_size)
    hidden = CONFIGS[0].hidden
    xs = [torch.randn(TOKENS[r], hidden, generator=g, dtype=F64) for r in range(world_size)]
    gs = [torch.randn(TOKENS[r], hidden, generator=g, dtype=F64) for r in range(world_size)]
    results = spawn(_layer_body, world_size, args=(xs, gs), timeout_s=240)
    close = {"rtol": 1e-10, "atol": 1e-12}  # float64 throughout (routing follows the input)
    exact = {"rtol": 1e-12, "atol": 1e-12}  # float64 throughout
    for ci, config in enumerate(CONFIGS):
        reference = ReferenceMoE(config, init_moe_weights(config, seed=ci, dtype=F64))
        x = torch.cat(xs).requires_grad_()
        y = reference(x)
        (y * torch.cat(gs)).sum().backward()
        per_rank = [r[ci] for r in results]
        torch.testing.assert_close(torch.cat([r["y"] for r in per_rank]), y.detach(), **close)
        torch.testing.assert_close(torch.cat([r["x_grad"] for r in per_rank]), x.grad, **close)
        # replicated weights (router, shared experts): the ranks' gradients sum to the reference's
        for name in [n for n in per_rank[0]["grads"] if not n.startswith("w_")]:
            total = sum(r["grads"][name] for r in per_rank)
            want = getattr(reference, SHARED.get(name, name)).grad
            torch.testing.assert_close(
                total, want, **(exact if name in SHARED else close), msg=name
            )
        assert reference.router.grad.abs().sum() > 0  # the router does learn through dispatch
        # routed experts: each rank holds a contiguous slice
        for name in ("w_gate", "w_up", "w_down"):
            local = torch.cat([r["grads"][name] for r in per_rank])
            torch.testing.assert_close(local, getattr(reference, name).grad, **close, msg=name)
        reference_bias = reference.update_expert_bias()
        for r in per_rank:
            assert torch.equal(r["load"], reference.last_tokens_per_expert)
            assert torch.equal(r["bias"], reference_bias)
