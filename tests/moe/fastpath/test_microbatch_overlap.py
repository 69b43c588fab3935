"""Microbatch overlap (DualPipe's pairing) on 2 gloo ranks: a dense module then an
expert-parallel MoE layer over 3 microbatches, overlapped == sequential bit for bit, both
equal to the stage computed token by token in one process, and the trace shows the
communication of one microbatch running under the compute of another."""

from __future__ import annotations

import time

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from nobubble.distributed import spawn
from nobubble.moe import Buffer, MoEConfig, MoELayer, init_moe_weights
from nobubble.moe.fastpath.overlap import communication_hidden, microbatch_overlapped_forward
from nobubble.trace import Event

D, H = 6, 12  # the dense part maps D -> H
CONFIGS = {
    "shared": MoEConfig(hidden=H, expert_hidden=8, num_experts=4, topk=2, num_shared_experts=1),
    "routed only": MoEConfig(hidden=H, expert_hidden=8, num_experts=4, topk=2),
}
TOKENS = ((5, 3, 4), (0, 6, 2))  # per rank, per microbatch: rank 1 sends nothing in microbatch 0


class Dense(nn.Module):
    """The stage's dense part: linear -> norm -> gelu, the same on every rank."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.lin, self.norm = nn.Linear(D, H), nn.LayerNorm(H)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        time.sleep(0.01)  # long enough that the communication in flight overlaps it
        return F.gelu(self.norm(self.lin(x)))


def _microbatch(e: Event) -> int:
    return int(e.name[1:])


def _overlapping_pairs(events: list[Event]) -> list[tuple[str, str]]:
    """(comm, compute) event names of different microbatches that ran at the same time."""
    comm = [e for e in events if e.lane == 1]
    compute = [e for e in events if e.lane == 0]
    return [
        (c.name, p.name)
        for c in comm
        for p in compute
        if _microbatch(c) != _microbatch(p)
        and c.start_us < p.start_us + p.dur_us
        and p.start_us < c.start_us + c.dur_us
    ]


def _body(ctx, xs_by_rank):
    xs = xs_by_rank[ctx.rank]
    pre, out = Dense(), {}
    for name, config in CONFIGS.items():
        layer = MoELayer(config, init_moe_weights(config, seed=3), Buffer(timeout_s=60))
        seq = microbatch_overlapped_forward(pre, layer, xs, overlap=False)
        ovl = microbatch_overlapped_forward(pre, layer, xs, overlap=True)
        assert all(torch.equal(a, b) for a, b in zip(seq.outs, ovl.outs, strict=True)), name
        comm_order = [e.name for e in sorted(ovl.events, key=lambda e: e.start_us) if e.lane == 1]
        assert comm_order == ["D0", "D1", "C0", "D2", "C1", "C2"], comm_order
        assert {(e.cat, e.lane) for e in ovl.events} >= {
            ("dense", 0),
            ("experts", 0),
            ("dispatch", 1),
            ("combine", 1),
        }
        assert _overlapping_pairs(seq.events) == []  # one thread: nothing at the same time
        assert _overlapping_pairs(ovl.events), ovl.events
        assert communication_hidden(seq) == 0.0
        assert 0.0 <= communication_hidden(ovl) <= 1.0 and ovl.comm_s > 0
        assert ovl.compute_s > 0.03  # three dense parts of >= 10 ms each are counted
        out[name] = ovl.outs
    with pytest.raises(ValueError, match="num_microbatches=0"):
        microbatch_overlapped_forward(pre, layer, [])
    with pytest.raises(ValueError, match=r"microbatch 1 has shape \(3, 7\)"):
        microbatch_overlapped_forward(pre, layer, [xs[0], torch.zeros(3, D + 1)])
    with pytest.raises(ValueError, match=r"returned \(\d+, 6\) for microbatch 0; .* hidden=12"):
        microbatch_overlapped_forward(nn.Identity(), layer, xs)
    return out


def _reference(config: MoEConfig, x: torch.Tensor) -> torch.Tensor:
    """The stage in one process: the dense part, then the MoE token by token, slot by slot."""
    w = init_moe_weights(config, seed=3)
    h = Dense()(x)  # (N, H)

    def swiglu(v, gate, up, down):
        return (F.silu(v @ gate.t()) * (v @ up.t())) @ down.t()

    rows = []
    for v in h:
        weights, ids = (v @ w.router.t()).softmax(dim=-1).topk(config.topk)
        row = sum(weights[k] * swiglu(v, w.w_gate[e], w.w_up[e], w.w_down[e])
                  for k, e in enumerate(ids.tolist()))  # fmt: skip
        if w.shared_gate is not None:
            row = row + swiglu(v, w.shared_gate, w.shared_up, w.shared_down)
        rows.append(row)
    return torch.stack(rows) if rows else h.new_zeros(0, H)


def test_microbatch_overlap_matches_sequential_and_reference():
    g = torch.Generator().manual_seed(5)
    xs = [[torch.randn(n, D, generator=g) for n in rank] for rank in TOKENS]
    results = spawn(_body, 2, args=(xs,), timeout_s=120)
    with torch.no_grad():
        for name, config in CONFIGS.items():
            for rank, res in enumerate(results):
                for got, x in zip(res[name], xs[rank], strict=True):
                    torch.testing.assert_close(got, _reference(config, x), rtol=1e-5, atol=1e-6)
