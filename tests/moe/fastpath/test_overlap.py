"""Chunked overlap on 2 and 4 gloo ranks: the same output as the sequential chunked forward
(bit for bit), as MoELayer and as the token-by-token reference MoE, over Buffer on gloo and on shared memory."""

from __future__ import annotations

import pytest
import torch

from nobubble.distributed import spawn
from nobubble.moe import Buffer, MoEConfig, MoELayer, ReferenceMoE, init_moe_weights
from nobubble.moe.fastpath.overlap import communication_hidden, overlapped_forward

CONFIG = MoEConfig(hidden=12, expert_hidden=8, num_experts=8, topk=2, num_shared_experts=1)
TOKENS = (9, 0, 7, 2)  # rank 1 has no tokens; rank 3 fewer tokens than chunks


def _body(ctx, xs):
    x = xs[ctx.rank]
    out = {}
    for name, buf in (
        ("gloo", Buffer(transport="dist", timeout_s=60)),
        ("shm", Buffer(transport="shm", timeout_s=60)),
    ):
        layer = MoELayer(CONFIG, init_moe_weights(CONFIG, seed=3), buf)
        with torch.no_grad():
            plain = layer(x)
        seq = overlapped_forward(layer, x, num_chunks=3, overlap=False)
        ovl = overlapped_forward(layer, x, num_chunks=3, overlap=True)
        assert torch.equal(seq.out, ovl.out), name
        lanes = {(e.cat, e.lane) for e in ovl.events}
        assert lanes == {("dispatch", 1), ("combine", 1), ("experts", 0)}, lanes
        assert len(ovl.events) == 9 and ovl.comm_s > 0
        assert communication_hidden(seq) == 0.0  # nothing overlaps in the sequential run
        assert 0.0 <= communication_hidden(ovl) <= 1.0
        out[name] = (ovl.out, plain)
    with pytest.raises(ValueError, match="num_chunks=0"):
        overlapped_forward(layer, x, num_chunks=0)
    return out


@pytest.mark.parametrize("world_size", [2, 4])
def test_overlap_matches_layer_and_reference(world_size):
    g = torch.Generator().manual_seed(11)
    xs = [torch.randn(TOKENS[r], CONFIG.hidden, generator=g) for r in range(world_size)]
    results = spawn(_body, world_size, args=(xs,), timeout_s=240)
    with torch.no_grad():
        reference = ReferenceMoE(CONFIG, init_moe_weights(CONFIG, seed=3))(torch.cat(xs))
    for name in ("gloo", "shm"):
        got = torch.cat([r[name][0] for r in results])
        plain = torch.cat([r[name][1] for r in results])
        torch.testing.assert_close(got, reference, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(got, plain, rtol=1e-5, atol=1e-6)
