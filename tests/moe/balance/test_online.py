"""A MoE layer with replicas on 4 gloo ranks equals the token-by-token reference MoE
(``nobubble.moe.reference_layer``, no code shared) - forward, every replica's own gradient,
the logical experts' gradients, live statistics and Adam steps - before and after an online
rebalance that moves experts (weights and optimizer state) between ranks."""

from __future__ import annotations

import pytest
import torch

from nobubble.distributed import spawn
from nobubble.moe.balance.eplb import rebalance_experts
from nobubble.moe.balance.incremental import count_moves
from nobubble.moe.balance.online import plan_migration, rebalance_online
from nobubble.moe.balance.replicated_layer import EXPERT_PARAMS, ReplicatedMoELayer
from nobubble.moe.buffer import Buffer
from nobubble.moe.layer import MoEConfig, init_moe_weights
from nobubble.moe.reference_layer import ReferenceMoE
from tests.moe.replica_probe import RecordingReplicaRouter

WORLD = 4
TOKENS = 12  # per rank
CONFIG = MoEConfig(
    hidden=8,
    expert_hidden=6,
    num_experts=8,
    topk=2,
    num_shared_experts=1,
    router="deepseek_v3",  # group-limited, with the aux-loss-free bias updated every step
    n_groups=2,
    topk_groups=1,
)


def batch(step: int):
    """Every rank's tokens and output gradients for one step: ``(WORLD, N, H)`` each."""
    g = torch.Generator().manual_seed(100 + step)
    x = torch.randn(WORLD, TOKENS, CONFIG.hidden, generator=g, dtype=torch.float64)
    dy = torch.randn(WORLD, TOKENS, CONFIG.hidden, generator=g, dtype=torch.float64)
    return x, dy


def close(a, b, what):
    """Float64 on both sides (the routers score in the logits' dtype); sums in other orders."""
    assert torch.allclose(a, b, rtol=1e-10, atol=1e-12), f"{what}: max err {(a - b).abs().max()}"


def check_step(ctx, layer, reference, step):
    """Forward + backward on both; outputs, expert grads (per replica, then per logical
    expert), router grads and stats agree."""
    x, dy = batch(step)
    for p in (*layer.parameters(), *reference.parameters()):
        p.grad = None
    out = layer(x[ctx.rank])
    (out * dy[ctx.rank]).sum().backward()
    # every rank's tokens, each slot on the replica the layer sent it to
    served = layer.buffer.transport.all_gather(layer.replica_router.chosen[-1], kind="test")
    ref = reference(x.reshape(-1, CONFIG.hidden), phy2log=layer.phy2log, physical_idx=served)
    (ref * dy.reshape(-1, CONFIG.hidden)).sum().backward()
    close(out, ref.view(WORLD, TOKENS, -1)[ctx.rank], f"step {step} forward")
    for i, name in enumerate(EXPERT_PARAMS):  # before the sync: each replica's own tokens
        mine = getattr(layer, name).grad
        per_rank = mine.shape[0]
        replicas = reference.last_replica_weights[i].grad  # (R, ...)
        want = replicas[ctx.rank * per_rank : (ctx.rank + 1) * per_rank]
        close(mine, want, f"step {step} {name} per replica")
    layer.sync_replica_grads()
    own = layer.own_logical_experts
    for name in EXPERT_PARAMS:  # each replica's grad = its logical expert's full grad
        close(getattr(layer, name).grad, getattr(reference, name).grad[own], f"step {step} {name}")
    router_grads = layer.buffer.transport.all_gather(layer.router.grad[None], kind="test")
    close(router_grads.sum(0), reference.router.grad, f"step {step} router grad")
    load = layer.collect_load_stats()  # live statistics, gathered over ranks
    want_load = reference.last_tokens_per_expert
    assert torch.equal(load, want_load), (load, want_load)
    assert torch.equal(layer.last_physical_load, reference.last.tokens_per_replica)
    # DeepSeek-V3's aux-loss-free balancing sees the same logical load through the replicas
    assert torch.equal(layer.update_expert_bias(), reference.update_expert_bias())


def run_rank(ctx):
    out = {s: run_strategy(ctx, s) for s in ("least_loaded", "token_hash", "round_robin")}
    weights = init_moe_weights(CONFIG, seed=1, dtype=torch.float64)
    buffer = Buffer(timeout_s=ctx.timeout_s)
    with pytest.raises(ValueError, match="13 physical experts do not split over 4 ranks"):
        ReplicatedMoELayer(CONFIG, weights, buffer, torch.arange(13) % 8)
    layer = ReplicatedMoELayer(CONFIG, weights, buffer, torch.arange(12) % 8)
    # ranks that disagree on the loads would place differently: every rank raises, none hangs
    skewed = torch.ones(8, dtype=torch.float64)
    skewed[ctx.rank] = 100.0
    with pytest.raises(RuntimeError, match="ranks computed different placements"):
        rebalance_online(layer, weight=skewed)
    assert torch.equal(layer.phy2log, torch.arange(12) % 8)  # nothing moved
    return out


def run_strategy(ctx, strategy):
    torch.manual_seed(0)
    weights = init_moe_weights(CONFIG, seed=1, dtype=torch.float64)
    # start from a placement made for the wrong loads: replicas of experts 6, 7 (cold)
    wrong = torch.tensor([[1.0, 1, 1, 1, 1, 1, 50, 40]])
    phy2log = rebalance_experts(wrong, 12, 1, 1, WORLD).phy2log[0]
    layer = ReplicatedMoELayer(
        CONFIG, weights, Buffer(timeout_s=ctx.timeout_s), phy2log, strategy=strategy
    )
    layer.replica_router = RecordingReplicaRouter(layer.replica_router)
    reference = ReferenceMoE(CONFIG, weights)
    opt = torch.optim.Adam([getattr(layer, n) for n in EXPERT_PARAMS], lr=1e-2)
    ref_opt = torch.optim.Adam([getattr(reference, n) for n in EXPERT_PARAMS], lr=1e-2)
    for step in range(2):
        check_step(ctx, layer, reference, step)
        opt.step()
        ref_opt.step()
    # hot experts per the live statistics are not the ones replicated: rebalance, fresh
    result = rebalance_online(layer, opt, incremental=False)
    assert result.num_moved > 0 and not torch.equal(result.new_phy2log, result.old_phy2log)
    moves = count_moves(result.old_phy2log[None], result.new_phy2log[None], WORLD)
    assert result.num_moved == int(moves[0])
    own = layer.own_logical_experts
    for name in EXPERT_PARAMS:  # moved weights and Adam moments are the logical expert's
        close(getattr(layer, name).detach(), getattr(reference, name).detach()[own], name)
        for key in ("exp_avg", "exp_avg_sq"):
            mine = opt.state[getattr(layer, name)][key]
            theirs = ref_opt.state[getattr(reference, name)][key][own]
            close(mine, theirs, f"{name} {key}")
    for step in range(2, 4):  # carry on training with the new placement
        check_step(ctx, layer, reference, step)
        opt.step()
        ref_opt.step()
    for name in EXPERT_PARAMS:
        want = getattr(reference, name).detach()[own]
        close(getattr(layer, name).detach(), want, f"end {name}")
    return {
        "moved": result.num_moved,
        "bytes": result.bytes_moved,
        "before": result.imbalance_before,
        "after": result.imbalance_after,
        "new": result.new_phy2log.tolist(),
    }


def test_replicated_layer_equals_the_reference_across_online_rebalance():
    """One job (4 ranks), all three replica-routing strategies; the checks run in the ranks."""
    by_rank = spawn(run_rank, WORLD, timeout_s=240)
    for strategy in ("least_loaded", "token_hash", "round_robin"):
        results = [r[strategy] for r in by_rank]
        assert len({str(r["new"]) for r in results}) == 1  # one placement everywhere
        assert results[0]["after"] < results[0]["before"]
        assert sum(r["bytes"] for r in results) > 0


def test_plan_migration_prefers_local_copies_and_spreads_sources():
    old = [0, 1, 2, 3, 0, 1]  # 3 ranks x 2: {0,1} {2,3} {0,1}
    new = [0, 2, 2, 3, 1, 3]  # rank 0 needs 2; rank 2 needs 3
    plan = plan_migration(old, new, 3)
    assert plan.num_moved == 2
    assert plan.source[0] == 0 and plan.source[2] == 2 and plan.source[3] == 3
    assert plan.source[1] == 2 and plan.source[5] == 3 and plan.source[4] == 5
    with pytest.raises(ValueError, match=r"logical experts \[4\]"):
        plan_migration(old, [4, 2, 2, 3, 1, 3], 3)
    with pytest.raises(ValueError, match="same multiple"):
        plan_migration(old, new[:3], 3)
