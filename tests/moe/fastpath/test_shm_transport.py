"""ShmTransport on 2 and 4 gloo ranks: bit-equal to gloo's all-to-all and, through Buffer, to
the all-gather reference (which never uses shared memory), with region growth, empty splits,
edge-case routing and timeouts."""

from __future__ import annotations

import glob
import time

import pytest
import torch

from nobubble.distributed import RankFailure, spawn
from nobubble.moe import Buffer, TorchDistTransport
from nobubble.moe.fastpath.shm_transport import (
    ShmTransport,
    default_transport_kind,
    make_transport,
)
from nobubble.moe.transport import Capabilities
from tests.moe.reference import reference_combine, reference_dispatch


def _encoded_rows(src: int, dst: int, n: int, width: int, dtype: torch.dtype) -> torch.Tensor:
    """Rows whose values say where they came from: src * 1e4 + dst * 100 + row."""
    base = torch.arange(n, dtype=torch.float64).view(n, 1) + 100 * dst + 10_000 * src
    return (base + torch.arange(width, dtype=torch.float64) / 8).to(dtype)  # (n, width)


def _routing(kind: str, n: int, num_experts: int, topk: int, g: torch.Generator):
    scores = torch.rand(n, num_experts, generator=g)
    if kind == "skewed":  # half the experts never chosen: empty experts on some ranks
        scores[:, num_experts // 2 :] = -1.0
    idx = scores.topk(topk, dim=1).indices
    if kind == "holes":
        idx[torch.rand(idx.shape, generator=g) < 0.3] = -1
        idx[: max(1, n // 3)] = -1  # tokens whose slots are all -1
    return idx, torch.rand(n, topk, generator=g)


def _check_all_to_all(ctx, shm: ShmTransport, ref: TorchDistTransport) -> None:
    r, world = ctx.rank, ctx.world_size
    g = torch.Generator().manual_seed(7)  # same on every rank: everybody knows every split
    for step, (width, dtype) in enumerate(
        [(3, torch.float32), (40, torch.bfloat16), (5, torch.int64), (300, torch.float32)]
    ):
        splits = torch.randint(0, 6 + 20 * step, (world, world), generator=g)  # [src, dst]
        splits[step % world] = 0  # a rank that sends nothing
        send = torch.cat(
            [_encoded_rows(r, d, int(splits[r, d]), width, dtype) for d in range(world)]
        )
        got = shm.all_to_all(send, splits[r].tolist(), splits[:, r].tolist(), kind="x")
        want = torch.cat(
            [_encoded_rows(s, r, int(splits[s, r]), width, dtype) for s in range(world)]
        )
        assert torch.equal(got, want), (step, dtype)
        assert torch.equal(
            got, ref.all_to_all(send, splits[r].tolist(), splits[:, r].tolist(), kind="x")
        )
    x = torch.randn(3, 5, generator=torch.Generator().manual_seed(r))
    assert torch.equal(shm.all_gather(x, kind="g"), ref.all_gather(x, kind="g"))
    blocks = torch.randn(world * 2, 7, generator=torch.Generator().manual_seed(r + 50))
    expected = sum(
        torch.randn(world * 2, 7, generator=torch.Generator().manual_seed(s + 50))[
            2 * r : 2 * r + 2
        ]
        for s in range(world)
    )
    assert torch.equal(shm.reduce_scatter(blocks, kind="rs"), expected)
    stats = shm.stats()
    assert stats.calls["x"] == 4
    assert stats.bytes_sent["g"] == ref.stats().bytes_sent["g"]
    assert stats.bytes_sent["g"] == x.numel() * 4 * world  # once per receiver, as gloo counts


def _check_buffer(ctx, buf: Buffer) -> None:
    r, world = ctx.rank, ctx.world_size
    cases = [  # name, tokens by rank, hidden, experts, topk, routing
        ("random", (9, 4, 7, 5), 16, 8, 3, "random"),
        ("zero-tokens-holes", (0, 6, 5, 8), 12, 8, 2, "holes"),
        ("empty-experts-k8", (7, 3, 0, 6), 10, 16, 8, "skewed"),
    ]
    for name, tokens, hidden, num_experts, topk, kind in cases:
        g = torch.Generator().manual_seed(31 * r + len(name))
        n = tokens[r % len(tokens)]
        topk_idx, topk_weights = _routing(kind, n, num_experts, topk, g)
        x = torch.randn(n, hidden, generator=g)
        buf.transport.reset_stats()
        res = buf.dispatch(x, topk_idx, topk_weights, num_experts=num_experts)
        in_rank = res.handle.is_token_in_rank
        assert buf.transport.stats().bytes_sent["x"] == int(in_rank.sum()) * hidden * 4, name
        ref = reference_dispatch(x, topk_idx, topk_weights, num_experts)
        assert torch.equal(res.recv_x, ref.recv_x), name
        assert torch.equal(res.recv_topk_idx, ref.recv_topk_idx), name
        assert torch.equal(res.recv_topk_weights, ref.recv_topk_weights), name
        assert res.num_recv_tokens_per_expert == ref.num_recv_tokens_per_expert, name
        y = torch.randn(res.recv_x.shape, generator=g)
        comb = buf.combine(y, res.handle)
        want = reference_combine(y, ref.recv_src_rank, ref.recv_src_token, n)
        assert torch.equal(comb.combined_x, want), name
    del world


def _run(ctx) -> str:
    shm = ShmTransport(timeout_s=30, capacity_bytes_per_peer=64)  # tiny: every size grows it
    ref = TorchDistTransport(timeout_s=30)
    _check_all_to_all(ctx, shm, ref)
    assert make_transport("auto", timeout_s=30).__class__ is ShmTransport
    unfused = ShmTransport(timeout_s=30, capacity_bytes_per_peer=100)
    unfused.capabilities = Capabilities()  # declares no fast path: the collective path over shm
    with Buffer(transport=unfused) as buf:
        assert buf.path == "collective"
        _check_buffer(ctx, buf)
    _check_fused(ctx)
    _check_recycled_outputs(ctx)
    key = shm._key
    shm.close()
    torch.distributed.barrier()
    return key


@pytest.mark.parametrize("world_size", [2, 4])
def test_shm_transport_and_fused_buffer_equal_gloo_and_reference(world_size):
    keys = spawn(_run, world_size, timeout_s=180)
    assert len(set(keys)) == 1
    assert glob.glob(f"/dev/shm/nobubble-ep-{keys[0]}-*") == []  # no names left behind


def _silent_peer(ctx) -> str:
    shm = ShmTransport(timeout_s=1.5)
    if ctx.rank == 1:
        time.sleep(30)  # never joins the exchange; rank 0 must give up, not hang
        return "slept"
    shm.all_to_all(torch.zeros(2, 4), [1, 1], [1, 1], kind="x")
    return "unreachable"


def test_silent_peer_times_out_with_a_clear_error():
    # rank 0 gives up with the transport's "waiting for rank" (its 1.5 s timeout), long
    # before rank 1 wakes (30 s) or spawn's own timeout (300 s)
    with pytest.raises(RankFailure, match="waiting for rank"):
        spawn(_silent_peer, 2, timeout_s=300)


def test_default_transport_per_backend_and_bad_kind():
    assert default_transport_kind("gloo", "cpu") == "shm"
    assert default_transport_kind("nccl", "cuda") == "dist"
    assert default_transport_kind("gloo", "cuda") == "dist"
    with pytest.raises(ValueError, match="kind='nvlink'"):
        make_transport("nvlink")


def _check_fused(ctx) -> None:
    fused = Buffer(transport=ShmTransport(timeout_s=30, capacity_bytes_per_peer=100))
    plain = Buffer(transport=TorchDistTransport(timeout_s=30))
    assert fused.path == "peer_writes"
    for dtype in (torch.float32, torch.bfloat16):
        for name, tokens, hidden, num_experts, topk, kind in [
            ("zero-tokens-holes", (0, 6, 5, 8), 12, 8, 2, "holes"),
            ("empty-experts-k8", (7, 3, 0, 6), 10, 16, 8, "skewed"),
            ("many-blocks", (70, 50), 4100, 8, 3, "random"),  # > 1 accumulator block
        ]:
            g = torch.Generator().manual_seed(5 * ctx.rank + hidden)
            n = tokens[ctx.rank % len(tokens)]
            idx, w = _routing(kind, n, num_experts, topk, g)
            x = torch.randn(n, hidden, generator=g).to(dtype).requires_grad_()
            got = fused.dispatch(x, idx, w, num_experts=num_experts)
            want = plain.dispatch(x, idx, w, num_experts=num_experts)
            assert torch.equal(got.recv_x, want.recv_x), name
            assert torch.equal(got.recv_topk_weights, want.recv_topk_weights), name
            y = torch.randn(got.recv_x.shape, generator=g).to(dtype)
            a = fused.combine(y, got.handle, topk_weights=got.recv_topk_weights)
            b = plain.combine(y, want.handle, topk_weights=want.recv_topk_weights)
            assert torch.equal(a.combined_x, b.combined_x), (name, dtype)
            assert torch.equal(a.combined_topk_weights, b.combined_topk_weights), name
            gx = torch.randn(got.recv_x.shape, generator=g).to(dtype)
            (grad_fused,) = torch.autograd.grad(got.recv_x, x, gx)
            (grad_plain,) = torch.autograd.grad(want.recv_x, x, gx)
            assert torch.equal(grad_fused, grad_plain), name
    fused.close()


def _check_recycled_outputs(ctx) -> None:
    """Outputs the caller still holds are never handed out again; dropped ones are; the torch
    and the C combine give the same bits."""
    import shutil

    from nobubble.moe.fastpath import cpu_kernels

    if shutil.which("cc") or shutil.which("gcc"):  # else both sides would be the torch path
        assert cpu_kernels.load() is not None
    fused = Buffer(transport="shm", timeout_s=30)
    torch_path = Buffer(transport=fused.transport, recycle_outputs=0, fused_kernels=False)
    outputs = fused._rows.outputs  # type: ignore[attr-defined]  # ShmRows' recycled outputs
    g = torch.Generator().manual_seed(ctx.rank)
    idx, w = _routing("random", 600, 8, 3, g)
    held = []
    for step in range(3):  # 600 x 1024 bf16 = 1.2 MiB: above the cache's 1 MiB floor
        x = torch.randn(600, 1024, generator=g).to(torch.bfloat16)
        res = fused.dispatch(x, idx, w, num_experts=8)
        out = fused.combine(res.recv_x, res.handle).combined_x
        want = torch_path.combine(res.recv_x, res.handle).combined_x
        assert torch.equal(out, want), step
        held.append((res.recv_x, res.recv_x.clone(), out, out.clone()))
    for recv, recv_copy, out, out_copy in held:  # nothing held was overwritten
        assert torch.equal(recv, recv_copy) and torch.equal(out, out_copy)
    assert outputs.hits == 0
    del held, res, out
    res = fused.dispatch(x, idx, w, num_experts=8)
    fused.combine(res.recv_x, res.handle)
    fused.close()
    assert outputs.hits == 2  # recv_x and the combined output reused dropped memory


def test_full_shared_memory_fails_with_a_message(monkeypatch, tmp_path):
    """A full /dev/shm must raise when the region is reserved, not SIGBUS on first write
    (filling the real /dev/shm of a shared machine is not an option in a test)."""
    import errno
    import os

    from nobubble.moe import TransportError
    from nobubble.moe.fastpath import shm_segment

    def no_space(fd, offset, length):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(shm_segment.os, "posix_fallocate", no_space)
    path = tmp_path / "region"
    with pytest.raises(TransportError, match="cannot reserve 64.0 MiB.*shm-size"):
        shm_segment.map_segment(str(path), 64 << 20, create=True)
    assert not path.exists()
