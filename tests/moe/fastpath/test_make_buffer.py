"""make_buffer: "auto" gives the shared-memory buffer for gloo on one CPU host, "dist" the
plain Buffer over gloo collectives; both move the same bits; a bad kind names itself."""

from __future__ import annotations

import glob

import pytest
import torch

from nobubble.distributed import spawn
from nobubble.moe import Buffer, ShmBuffer, ShmTransport, TorchDistTransport, make_buffer


def _run(ctx) -> str:
    auto = make_buffer("auto", num_experts=8, timeout_s=30)
    plain = make_buffer("dist", num_experts=8, timeout_s=30)
    shm = make_buffer("shm", num_experts=8, timeout_s=30)
    assert type(auto) is ShmBuffer and isinstance(auto.transport, ShmTransport)
    assert type(shm) is ShmBuffer and shm.num_experts == 8
    assert type(plain) is Buffer and type(plain.transport) is TorchDistTransport
    assert plain.num_experts == 8 and plain.transport.timeout_s == 30
    g = torch.Generator().manual_seed(11 + ctx.rank)
    n = 9 + 4 * ctx.rank
    topk_idx = torch.rand(n, 8, generator=g).topk(3, dim=1).indices  # (N, 3)
    topk_weights = torch.rand(n, 3, generator=g)
    for dtype in (torch.float32, torch.bfloat16):
        x = torch.randn(n, 16, generator=g).to(dtype)
        results = []
        for buf in (auto, shm, plain):
            res = buf.dispatch(x, topk_idx, topk_weights)
            y = (res.recv_x.float() * 1.5).to(dtype)  # an expert that changes the rows
            comb = buf.combine(y, res.handle, topk_weights=res.recv_topk_weights)
            results.append((res.recv_x, res.recv_topk_weights, comb.combined_x))
        for got in results[:2]:
            for a, b in zip(got, results[2], strict=True):
                assert torch.equal(a, b), dtype
    keys = [auto.shm._key, shm.shm._key]
    auto.shm.close()
    shm.shm.close()
    torch.distributed.barrier()
    return ",".join(keys)


def test_make_buffer_auto_shm_dist_move_the_same_bits():
    keys = spawn(_run, 2, timeout_s=120)
    assert len(set(keys)) == 1
    for key in keys[0].split(","):
        assert glob.glob(f"/dev/shm/nobubble-ep-{key}-*") == []  # no names left behind


def test_make_buffer_bad_kind_names_it_and_the_choices():
    with pytest.raises(ValueError, match=r"kind='bogus'; choose one of \('auto', 'shm', 'dist'\)"):
        make_buffer("bogus")
