"""Bit-reproducible dispatch / combine: the same seed gives the same output hashes, run after
run, in every mode (normal, shared memory, hierarchical, low-latency, FP8), as DeepEP's tests
check with hashes.

Each mode runs on 4 gloo ranks (with 2 contributions per token a sum is the same in either
order - float addition commutes - so only 3 or more sources can expose an order-dependent
combine). One spawn repeats each mode's seeded round ``NUM_REPS`` times, each with fresh
buffers (fresh shared-memory regions, fresh node/rail groups) and a different arrival order:
from the second repetition on, rank ``r`` sleeps ``DELAY_S * ((r + rep + phase) % R)`` before
each dispatch, combine and backward, so a different rank is first and last every time. A
round hashes (sha256 of dtype, shape and bytes) everything dispatch, combine and, for the
Buffer-based modes, autograd produce: received rows, routing and weights, combined rows and
weights, input and weight gradients. The hashes of one rank must be equal across repetitions,
equal to those of a separate process group (a module fixture runs every mode once more), and
normal, shm and hierarchical (4 nodes x 1 rank, where node order is rank order) must agree
with each other. Over shared memory the test logs the order in which the peers' slots arrive
and checks that the delays did change it (on at least half the ranks).
"""

from __future__ import annotations

import hashlib
import time

import pytest
import torch

from nobubble.distributed import spawn
from nobubble.moe import Buffer
from nobubble.moe.fastpath.fp8 import fp8_dispatch
from nobubble.moe.fastpath.hierarchical import Topology

pytestmark = pytest.mark.xdist_group("moe-reproducible")  # its module fixtures run once

MODES = ("normal", "shm", "hierarchical", "low_latency", "fp8")
SHM_MODES = ("shm", "low_latency", "fp8")  # modes whose receive order depends on arrival
WORLD = 4
HIDDEN, NUM_EXPERTS, TOPK = 32, 16, 4  # 4 local experts per rank
TOKENS = (20, 13, 0, 17)  # rank 2 dispatches nothing (it still receives and combines)
T_MAX = max(TOKENS)  # low-latency capacity per rank
NUM_REPS = 3
DELAY_S = 0.02
SEED = 1234
LL_ROUNDS = ((torch.float32, False), (torch.bfloat16, False), (torch.bfloat16, True))  # dtype, fp8

Tensors = list[tuple[str, torch.Tensor]]


# -- inputs, the stand-in expert, hashing ---------------------------------------------------
def _inputs(rank: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``x [N, H]``, ``topk_idx [N, K]`` (some slots -1, token 0 routed nowhere), ``w [N, K]``
    - a function of ``(SEED, rank)`` only."""
    g = torch.Generator().manual_seed(SEED + rank)
    n = TOKENS[rank]
    x = torch.randn(n, HIDDEN, generator=g).to(dtype)
    idx = torch.rand(n, NUM_EXPERTS, generator=g).topk(TOPK, dim=1).indices  # (N, K)
    idx[torch.rand(idx.shape, generator=g) < 0.15] = -1
    if n:
        idx[0] = -1
    w = torch.rand(n, TOPK, generator=g)
    return x, idx, w


def _grad_outputs(rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Upstream gradients for ``combined_x [N, H]`` and ``combined_topk_weights [N, K]``."""
    g = torch.Generator().manual_seed(SEED + 100 + rank)
    n = TOKENS[rank]
    return torch.randn(n, HIDDEN, generator=g), torch.randn(n, TOPK, generator=g)


def _expert(rank: int, recv_x: torch.Tensor, local_idx: torch.Tensor, recv_w: torch.Tensor):
    """Differentiable stand-in expert: each row scaled by ``sum_k w_k (1 + e_k)`` and by a
    factor of the rank, so every source's contribution to a token differs. ``[M, H]``."""
    scale = (recv_w * (1 + local_idx.clamp(min=0))).sum(dim=1) * (1 + 0.25 * rank)  # (M,)
    return (recv_x.float() * scale.unsqueeze(1)).to(recv_x.dtype)


def _digest(tensors: Tensors) -> str:
    h = hashlib.sha256()
    for name, t in tensors:
        t = t.detach().contiguous().cpu()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        h.update(t.view(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def _pause(rank: int, rep: int, phase: int) -> None:
    """No delay in repetition 0; then a rotation of delays, so that arrival order changes."""
    if rep > 0:
        time.sleep(DELAY_S * ((rank + rep + phase) % WORLD))


def _log_arrivals(shm, orders: list[list[int]]) -> None:
    """Record, on this transport instance, the order in which peers' slots arrive."""
    exchange, poll_slots = shm.exchange, shm.poll_slots

    def logged_exchange(t, writes, recv_nbytes, on_slot, *, kind):
        order: list[int] = []
        orders.append(order)

        def on(i, slot):
            order.append(i)
            on_slot(i, slot)

        exchange(t, writes, recv_nbytes, on, kind=kind)

    def logged_poll(t, recv_nbytes, *, kind):
        order: list[int] = []
        orders.append(order)
        for i, slot in poll_slots(t, recv_nbytes, kind=kind):
            order.append(i)
            yield i, slot

    setattr(shm, "exchange", logged_exchange)  # noqa: B010 - instance-level shadowing
    setattr(shm, "poll_slots", logged_poll)  # noqa: B010


# -- one round per mode ---------------------------------------------------------------------
def _buffer_round(buf: Buffer, rank: int, rep: int, dtype: torch.dtype) -> Tensors:
    """dispatch -> expert -> combine (rows and weights) -> backward, on any Buffer."""
    x, idx, w = _inputs(rank, dtype)
    gx, gw = _grad_outputs(rank)
    x, w = x.requires_grad_(), w.requires_grad_()
    _pause(rank, rep, 0)
    res = buf.dispatch(x, idx, w, num_experts=NUM_EXPERTS)
    assert res.recv_topk_idx is not None and res.recv_topk_weights is not None
    y = _expert(rank, res.recv_x, res.recv_topk_idx, res.recv_topk_weights)  # (M, H)
    _pause(rank, rep, 1)
    comb = buf.combine(y, res.handle, topk_weights=res.recv_topk_weights)
    assert comb.combined_topk_weights is not None
    loss = (comb.combined_x.float() * gx).sum() + (comb.combined_topk_weights * gw).sum()
    _pause(rank, rep, 2)
    loss.backward()
    assert x.grad is not None and w.grad is not None
    return [
        ("recv_x", res.recv_x),
        ("recv_topk_idx", res.recv_topk_idx),
        ("recv_topk_weights", res.recv_topk_weights),
        ("recv_src_idx", res.handle.recv_src_idx),
        ("combined_x", comb.combined_x),
        ("combined_topk_weights", comb.combined_topk_weights),
        ("x_grad", x.grad),
        ("w_grad", w.grad),
    ]


def _fp8_round(buf: Buffer, rank: int, rep: int, dtype: torch.dtype) -> Tensors:
    x, idx, w = _inputs(rank, dtype)
    _pause(rank, rep, 0)
    res = fp8_dispatch(buf, x, idx, w, num_experts=NUM_EXPERTS)
    assert res.recv_topk_idx is not None and res.recv_topk_weights is not None
    y = _expert(rank, res.recv_x, res.recv_topk_idx, res.recv_topk_weights)
    _pause(rank, rep, 1)
    comb = buf.combine(y, res.handle)
    return [("recv_x", res.recv_x), ("combined_x", comb.combined_x)]


def _low_latency_round(
    buf: Buffer, rank: int, rep: int, dtype: torch.dtype, use_fp8: bool
) -> Tensors:
    x, idx, w = _inputs(rank, dtype)
    _pause(rank, rep, 0)
    res = buf.low_latency_dispatch(
        x, idx, num_max_dispatch_tokens_per_rank=T_MAX, use_fp8=use_fp8, return_recv_hook=True
    )
    assert res.hook is not None
    res.hook()
    layout = res.handle.recv_layout  # (L, R)
    out = res.recv_x.clone()  # (L, R * T, H); padding rows are never read
    valid: Tensors = []
    local = NUM_EXPERTS // WORLD
    for e in range(local):
        out[e] = out[e] * (1 + rank * local + e)
        for i in range(WORLD):  # only valid rows: the padding is uninitialised memory
            rows = res.recv_x[e, i * T_MAX : i * T_MAX + int(layout[e, i])]
            valid.append((f"recv_x[{e},{i}]", rows))
    _pause(rank, rep, 1)
    combined = buf.low_latency_combine(out, idx, w, res.handle)
    return [*valid, ("recv_count", res.recv_count), ("layout", layout), ("combined", combined)]


def _round(mode: str, rank: int, rep: int, orders: list[list[int]]) -> str:
    """One seeded round of ``mode`` with fresh buffers; returns its hash on this rank."""
    out: Tensors = []
    if mode == "low_latency":
        with Buffer(None, NUM_EXPERTS, transport="shm", timeout_s=60) as ll:
            _log_arrivals(ll.transport, orders)
            for dtype, use_fp8 in LL_ROUNDS:
                out += _low_latency_round(ll, rank, rep, dtype, use_fp8)
        return _digest(out)
    buf: Buffer
    if mode == "normal":
        buf = Buffer(transport="dist", timeout_s=60)
    elif mode == "hierarchical":
        buf = Buffer(topology=Topology(ranks_per_node=1), timeout_s=60)  # 4 nodes x 1 rank
    else:  # shm, fp8
        buf = Buffer(transport="shm", timeout_s=60)
        _log_arrivals(buf.transport, orders)
    if mode == "fp8":  # FP8 dispatch over the host's default buffer, bf16 combine
        out += _fp8_round(buf, rank, rep, torch.bfloat16)
    else:
        for dtype in (torch.float32, torch.bfloat16):
            out += _buffer_round(buf, rank, rep, dtype)
    buf.close()  # its shared-memory regions (the node's, with a topology)
    return _digest(out)


def _rank_body(ctx, modes: tuple[str, ...], reps: range) -> dict:
    result = {}
    for mode in modes:
        orders: list[list[int]] = []
        hashes = [_round(mode, ctx.rank, rep, orders) for rep in reps]
        result[mode] = {"hashes": hashes, "orders": orders}
    return result


def _run(modes: tuple[str, ...], reps: range) -> list[dict]:
    return spawn(_rank_body, WORLD, args=(modes, reps), timeout_s=120)


# -- tests ----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def other_group() -> list[dict]:
    """Every mode once more, in a separate process group, with its own delay pattern."""
    return _run(MODES, range(NUM_REPS, NUM_REPS + 1))


@pytest.fixture(scope="module")
def main_group() -> list[dict]:
    """Every mode ``NUM_REPS`` times, each repetition with its own arrival order."""
    return _run(MODES, range(NUM_REPS))


@pytest.mark.parametrize("mode", MODES)
def test_same_seed_same_hashes(mode: str, main_group: list[dict], other_group: list[dict]) -> None:
    results = main_group
    for rank, res in enumerate(results):
        hashes = res[mode]["hashes"]
        assert len(set(hashes)) == 1, f"{mode}: rank {rank} hashes differ across runs: {hashes}"
        again = other_group[rank][mode]["hashes"][0]
        assert hashes[0] == again, f"{mode}: rank {rank} differs in another process group"
    if mode in SHM_MODES:  # the delays really did change the order in which slots arrive
        varied = [len(s) for s in _arrival_patterns(results, mode)]
        assert sum(v > 1 for v in varied) >= WORLD // 2, f"{mode}: arrival orders per rank {varied}"


def _arrival_patterns(results: list[dict], mode: str) -> list[set[tuple]]:
    """Per rank, the distinct sequences of per-call arrival orders over the repetitions."""
    patterns = []
    for res in results:
        orders = res[mode]["orders"]
        per_rep = len(orders) // NUM_REPS
        patterns.append(
            {tuple(map(tuple, orders[i * per_rep : (i + 1) * per_rep])) for i in range(NUM_REPS)}
        )
    return patterns


def test_normal_shm_and_hierarchical_agree_bit_for_bit(other_group: list[dict]) -> None:
    """Gloo, shared memory and 4 nodes x 1 rank sum in the same (rank = node) order."""
    for rank, res in enumerate(other_group):
        got = {m: res[m]["hashes"][0] for m in ("normal", "shm", "hierarchical")}
        assert len(set(got.values())) == 1, (rank, got)


def test_digest_sees_every_bit() -> None:
    a = torch.randn(3, 4, generator=torch.Generator().manual_seed(0))
    b = a.clone()
    b.view(-1).view(torch.int32)[5] ^= 1  # one ulp in one element
    assert _digest([("a", a)]) == _digest([("a", a.clone())])
    assert _digest([("a", a)]) != _digest([("a", b)])
    assert _digest([("a", a)]) != _digest([("a", a.to(torch.float64))])
