"""The MoE layer against its token-by-token reference (``nobubble.moe.reference_layer``).

The reference shares no code with the layer, so these tests catch what a reference built
from the layer's own pieces cannot: a wrong slot weight in ``apply_experts``, a broken shared
expert, a wrong DeepSeek-V3 normalisation. Everything runs in one process: the layer over a
:class:`Buffer` whose transport is a world of one (the multi-rank runs are in
``test_layer.py`` and ``balance/test_online.py``). Float64 throughout (the routers score in
the logits' dtype): wherever a routing weight enters, layer and reference agree to
:data:`ROUTED` (the sums run in other orders, through exp and a normalisation), elsewhere -
the shared experts' gradients, ``apply_experts`` given its weights - to :data:`EXACT`; loads
and the bias update are equal.
"""

from __future__ import annotations

import ast
import inspect
import math
from collections.abc import Sequence

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from nobubble.moe import (
    Buffer,
    MoEConfig,
    MoELayer,
    ReferenceMoE,
    init_moe_weights,
    reference_layer,
    softmax_topk,
)
from nobubble.moe.balance.replicas import STRATEGIES
from nobubble.moe.balance.replicated_layer import ReplicatedMoELayer
from nobubble.moe.layer import apply_experts
from nobubble.moe.reference_layer import (
    reference_bias_update,
    reference_expert,
    reference_moe_forward,
    reference_route,
)
from nobubble.moe.routing import deepseek_v3_topk, update_expert_bias
from nobubble.moe.transport import TransportStats
from tests.moe.replica_probe import RecordingReplicaRouter

EXACT = {"rtol": 1e-12, "atol": 1e-12}
"""Float64 against float64, summed in another order."""
ROUTED = {"rtol": 1e-10, "atol": 1e-12}
"""Through the router, float64: exp, normalisation and per-token sums in another order (the
router's gradient included, whose per-token terms may cancel to ~0)."""
F64 = torch.float64


class Loopback:
    """A :class:`~nobubble.moe.transport.Transport` for a world of one: rows stay put."""

    rank, world_size, kind = 0, 1, "loopback"

    def all_to_all(
        self, send: torch.Tensor, send_splits: Sequence[int], recv_splits: Sequence[int], *, kind
    ) -> torch.Tensor:
        return send.clone()

    def all_gather(self, x: torch.Tensor, *, kind: str) -> torch.Tensor:
        return x.clone()

    def reduce_scatter(self, x: torch.Tensor, *, kind: str) -> torch.Tensor:
        return x.clone()

    def stats(self) -> TransportStats:
        return TransportStats({}, {}, {}, {})

    def reset_stats(self) -> None:
        pass

    def close(self) -> None:
        pass


def test_the_reference_imports_only_torch():
    """Sharing no code with the layer is the point: no import of nobubble, nor of F.silu."""
    tree = ast.parse(inspect.getsource(reference_layer))
    imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert imported <= {"__future__", "dataclasses", "typing", "torch"}, imported


# -- apply_experts: the slot-weighted expert sum ---------------------------------------------
@st.composite
def expert_case(draw):
    n, k = draw(st.integers(0, 6)), draw(st.integers(1, 3))
    num_experts = draw(st.integers(1, 4))
    # -1 and num_experts (another rank's expert) are skipped
    ids = draw(st.lists(st.integers(-1, num_experts), min_size=n * k, max_size=n * k))
    return n, k, num_experts, torch.tensor(ids, dtype=torch.int64).view(n, k), draw(st.integers())


@settings(max_examples=60, deadline=None)
@given(expert_case(), st.integers(1, 5), st.integers(1, 4))
def test_apply_experts_equals_the_per_token_loop(case, hidden, inner):
    n, k, num_experts, topk_idx, seed = case
    g = torch.Generator().manual_seed(seed % 2**32)

    def leaf(*shape):
        return torch.randn(*shape, generator=g, dtype=F64).requires_grad_()

    x, weights = leaf(n, hidden), leaf(n, k)
    w = (leaf(num_experts, inner, hidden), leaf(num_experts, inner, hidden))
    w_down = leaf(num_experts, hidden, inner)
    dy = torch.randn(n, hidden, generator=g, dtype=F64)
    got = apply_experts(x, topk_idx, weights, *w, w_down)  # (n, H)
    rows = []
    for t in range(n):
        row = torch.zeros(hidden, dtype=F64)
        for slot, e in enumerate(topk_idx[t].tolist()):
            if 0 <= e < num_experts:
                row = row + weights[t, slot] * reference_expert(x[t], w[0][e], w[1][e], w_down[e])
        rows.append(row)
    want = torch.stack(rows) if rows else torch.zeros(0, hidden, dtype=F64)
    torch.testing.assert_close(got, want, **EXACT)
    leaves = (x, weights, *w, w_down)
    for name, a, b in zip(("x", "weights", "w_gate", "w_up", "w_down"),
                          _grads(got, dy, leaves), _grads(want, dy, leaves)):  # fmt: skip
        torch.testing.assert_close(a, b, **EXACT, msg=name)


def _grads(out, dy, leaves):
    """d(sum(out * dy)) / d(leaves); zeros for a leaf the output does not reach."""
    if not out.requires_grad:
        return [torch.zeros_like(leaf) for leaf in leaves]
    grads = torch.autograd.grad((out * dy).sum(), leaves, allow_unused=True)
    return [torch.zeros_like(leaf) if g is None else g for g, leaf in zip(grads, leaves)]


# -- routers ---------------------------------------------------------------------------------
@settings(max_examples=80, deadline=None)
@given(st.integers(0, 6), st.integers(1, 9), st.data(), st.booleans(), st.integers())
def test_softmax_topk_keeps_the_largest_probabilities(num_tokens, num_experts, data, norm, seed):
    topk = data.draw(st.integers(1, num_experts))
    g = torch.Generator().manual_seed(seed % 2**32)
    logits = torch.randn(num_tokens, num_experts, generator=g, dtype=F64) * 3
    r = softmax_topk(logits, topk, normalize=norm)
    probs = logits.softmax(dim=-1)  # (N, E) float64
    rule = MoEConfig(hidden=1, expert_hidden=1, num_experts=num_experts, topk=topk)
    assert r.topk_idx.shape == r.topk_weights.shape == (num_tokens, topk)
    for t in range(num_tokens):
        idx = r.topk_idx[t].tolist()
        assert len(set(idx)) == topk and all(0 <= e < num_experts for e in idx)
        rest = [probs[t, e] for e in range(num_experts) if e not in idx]
        assert all(p <= probs[t, idx].min() for p in rest)  # the top k, nothing else
        w = r.topk_weights[t].double()
        assert all(a >= b for a, b in zip(w.tolist(), w[1:].tolist()))  # descending
        want = probs[t, idx] / probs[t, idx].sum() if norm else probs[t, idx]
        torch.testing.assert_close(w, want, **ROUTED)
        chosen, ref_w = reference_route(logits[t], rule)
        assert chosen == idx
        if norm:
            assert math.isclose(float(w.sum()), 1.0, rel_tol=1e-6)
        else:
            torch.testing.assert_close(w, ref_w, **ROUTED)


@st.composite
def v3_rule(draw):
    n_groups = draw(st.sampled_from([1, 2, 3, 4]))
    per_group = draw(st.integers(1, 4))
    topk_groups = draw(st.integers(1, n_groups))
    return MoEConfig(
        hidden=1,
        expert_hidden=1,
        num_experts=n_groups * per_group,
        topk=draw(st.integers(1, topk_groups * per_group)),
        router="deepseek_v3",
        n_groups=n_groups,
        topk_groups=topk_groups,
        route_scale=draw(st.sampled_from([1.0, 2.5])),
    )


@settings(max_examples=80, deadline=None)
@given(v3_rule(), st.integers(0, 6), st.integers())
def test_deepseek_v3_chooses_inside_the_best_groups(rule, num_tokens, seed):
    g = torch.Generator().manual_seed(seed % 2**32)
    e, per_group = rule.num_experts, rule.num_experts // rule.n_groups
    logits = torch.randn(num_tokens, e, generator=g, dtype=F64) * 2
    bias = torch.randn(e, generator=g, dtype=F64) * 0.1
    r = deepseek_v3_topk(logits, rule.topk, n_groups=rule.n_groups, bias=bias,
                         topk_groups=rule.topk_groups, route_scale=rule.route_scale)  # fmt: skip
    biased = (logits.sigmoid() + bias).view(num_tokens, rule.n_groups, per_group)  # float64
    group_score = biased.sort(dim=-1, descending=True).values[..., :2].sum(-1)  # (N, G)
    for t in range(num_tokens):
        best = group_score[t].argsort(descending=True)[: rule.topk_groups].tolist()
        idx = r.topk_idx[t].tolist()
        assert len(set(idx)) == rule.topk and all(i // per_group in best for i in idx)
        w = r.topk_weights[t].double()
        assert (w > 0).all() and math.isclose(float(w.sum()), rule.route_scale, rel_tol=1e-6)
        chosen, ref_w = reference_route(logits[t], rule, bias)
        assert chosen == idx
        torch.testing.assert_close(w, ref_w, **ROUTED)


def test_reference_by_hand():
    """One token, two experts of width one: every number below is written out."""
    rule = MoEConfig(hidden=1, expert_hidden=1, num_experts=2, topk=1, num_shared_experts=1)
    x = torch.tensor([[1.0]], dtype=F64)
    router = torch.tensor([[math.log(3.0)], [0.0]], dtype=F64)  # softmax (3/4, 1/4)
    w_gate = torch.tensor([[[2.0]], [[9.0]]], dtype=F64)  # (E, I, H); expert 1 is never used
    w_up = torch.tensor([[[3.0]], [[9.0]]], dtype=F64)
    w_down = torch.tensor([[[0.5]], [[9.0]]], dtype=F64)
    shared = tuple(torch.tensor([[v]], dtype=F64) for v in (1.0, 4.0, 0.25))
    res = reference_moe_forward(x, rule=rule, router=router, w_gate=w_gate, w_up=w_up,
                                w_down=w_down, shared=shared)  # fmt: skip

    def silu(z):
        return z / (1 + math.exp(-z))

    want = 0.75 * 0.5 * silu(2.0) * 3.0 + 0.25 * silu(1.0) * 4.0
    assert res.topk_idx.tolist() == [[0]] and res.tokens_per_expert.tolist() == [1, 0]
    assert math.isclose(float(res.out), want, rel_tol=1e-15)
    # DeepSeek-V3: sigmoid scores (1/2, 3/4, 1/4 + bias), top-2 of s + b, weights s / sum * 2
    v3 = MoEConfig(hidden=1, expert_hidden=1, num_experts=3, topk=2, router="deepseek_v3",
                   route_scale=2.0)  # fmt: skip
    logits = torch.tensor([0.0, math.log(3.0), -math.log(3.0)], dtype=F64)
    chosen, w = reference_route(logits, v3, torch.tensor([0.0, 0.0, 0.3]))
    assert chosen == [1, 2]  # 0.25 + 0.3 beats 0.5
    torch.testing.assert_close(w, torch.tensor([0.75, 0.25], dtype=F64) * 2, **EXACT)


def test_bias_update_against_the_layer_function():
    g = torch.Generator().manual_seed(0)
    for num_experts in (1, 4, 7):
        ids = torch.randint(-1, num_experts, (20, 3), generator=g)
        load = torch.bincount(ids[ids >= 0], minlength=num_experts)
        bias = torch.randn(num_experts, generator=g)
        assert torch.equal(reference_bias_update(bias, load, 0.01),
                           update_expert_bias(bias, load, 0.01))  # fmt: skip


# -- the layer, forward and every gradient ---------------------------------------------------
@st.composite
def layer_case(draw):
    router = draw(st.sampled_from(["softmax", "deepseek_v3"]))
    n_groups = draw(st.sampled_from([1, 2, 4])) if router == "deepseek_v3" else 1
    num_experts = n_groups * draw(st.integers(1, 3))
    topk_groups = draw(st.integers(1, n_groups))
    reachable = num_experts // n_groups * topk_groups
    config = MoEConfig(
        hidden=draw(st.integers(2, 6)),
        expert_hidden=draw(st.integers(1, 4)),
        num_experts=num_experts,
        topk=draw(st.integers(1, reachable)),
        num_shared_experts=draw(st.integers(0, 2)),
        router=router,
        n_groups=n_groups,
        topk_groups=topk_groups,
        route_scale=draw(st.sampled_from([1.0, 2.5])),
        bias_update_rate=0.01,
    )
    extra = draw(st.lists(st.integers(0, num_experts - 1), max_size=3))  # redundant experts
    replicas = draw(st.booleans())
    order = draw(st.permutations(list(range(num_experts)) + extra)) if replicas else None
    strategy = draw(st.sampled_from(STRATEGIES))
    return config, order, strategy, draw(st.integers(1, 8)), draw(st.integers(0, 1000))


SHARED = {"shared.0": "shared_gate", "shared.1": "shared_up", "shared.2": "shared_down"}


@settings(max_examples=60, deadline=None)
@given(layer_case())
def test_layer_equals_the_reference_forward_and_every_gradient(case):
    config, order, strategy, num_tokens, seed = case
    weights = init_moe_weights(config, seed=seed, dtype=F64)
    buffer = Buffer(transport=Loopback())
    if order is None:
        layer: MoELayer = MoELayer(config, weights, buffer)
        recorder = None
    else:
        phy2log = torch.tensor(order, dtype=torch.int64)
        layer = ReplicatedMoELayer(config, weights, buffer, phy2log, strategy=strategy)
        layer.replica_router = recorder = RecordingReplicaRouter(layer.replica_router)
    reference = ReferenceMoE(config, weights)
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(num_tokens, config.hidden, generator=g, dtype=F64)
    dy = torch.randn(num_tokens, config.hidden, generator=g, dtype=F64)
    x_layer, x_ref = x.clone().requires_grad_(), x.clone().requires_grad_()
    y = layer(x_layer)
    (y * dy).sum().backward()
    physical = None if recorder is None else dict(phy2log=phy2log, physical_idx=recorder.chosen[0])
    want = reference(x_ref, **(physical or {}))
    (want * dy).sum().backward()

    torch.testing.assert_close(y, want, **ROUTED, msg="forward")
    torch.testing.assert_close(x_layer.grad, x_ref.grad, **ROUTED, msg="input grad")
    assert reference.last is not None
    assert torch.equal(layer.route(x).topk_idx, reference.last.topk_idx)
    for name, p in layer.named_parameters():
        if name in ("w_gate", "w_up", "w_down"):
            continue
        ref = getattr(reference, SHARED.get(name, name))
        close = EXACT if name in SHARED else ROUTED  # shared experts: no routing weight
        torch.testing.assert_close(p.grad, ref.grad, **close, msg=name)
    for i, name in enumerate(("w_gate", "w_up", "w_down")):
        got = getattr(layer, name).grad
        if recorder is None:
            torch.testing.assert_close(got, getattr(reference, name).grad, **ROUTED, msg=name)
            continue
        assert reference.last_replica_weights is not None
        per_replica = reference.last_replica_weights[i].grad  # (R, ...) each replica's own
        torch.testing.assert_close(got, per_replica, **ROUTED, msg=f"{name} per replica")
    if recorder is not None:
        assert torch.equal(layer.last_physical_load, reference.last.tokens_per_replica)
        layer.sync_replica_grads()  # every replica: its logical expert's whole gradient
        for name in ("w_gate", "w_up", "w_down"):
            want_grad = getattr(reference, name).grad[phy2log]
            torch.testing.assert_close(getattr(layer, name).grad, want_grad, **ROUTED, msg=name)
    assert torch.equal(layer.last_tokens_per_expert, reference.last_tokens_per_expert)
    assert torch.equal(layer.update_expert_bias(), reference.update_expert_bias())


def test_reference_refuses_a_slot_served_by_another_experts_replica():
    config = MoEConfig(hidden=4, expert_hidden=2, num_experts=2, topk=1)
    reference = ReferenceMoE(config, init_moe_weights(config, dtype=F64))
    x = torch.randn(1, 4, dtype=F64)
    chosen = int(reference_route(reference.router.detach() @ x[0], config)[0][0])
    phy2log = torch.tensor([0, 1, chosen])
    reference(x, phy2log=phy2log, physical_idx=torch.tensor([[2]]))  # its own replica: fine
    with pytest.raises(ValueError, match="not one of its replicas"):
        reference(x, phy2log=phy2log, physical_idx=torch.tensor([[1 - chosen]]))
