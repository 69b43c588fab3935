"""One round of expert-parallel dispatch -> experts -> combine, for the launch tests.

Run by ``torchrun`` (``python ep_script.py OUT_DIR RANKS_PER_NODE``: each rank saves its
result to ``OUT_DIR/rank{r}.pt``) and by ``nobubble.distributed.spawn`` (``ep_round``) in
the same test, which compares the two bit for bit. ``RANKS_PER_NODE`` below the world size
runs the hierarchical path (nodes of that many ranks; over two torchrun agents, one node
per agent).
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from nobubble.distributed import DistContext, context_from_env
from nobubble.moe import Buffer, Topology

HIDDEN, NUM_EXPERTS, TOPK, TOKENS = 16, 8, 3, 12


def ep_round(ctx: DistContext, ranks_per_node: int) -> dict:
    """Tokens seeded by rank; each expert scales its rows by ``1 + expert id / 8``."""
    topology = Topology(ranks_per_node=ranks_per_node) if ranks_per_node < ctx.world_size else None
    buf = Buffer(None, NUM_EXPERTS, transport="dist", topology=topology, timeout_s=60)
    g = torch.Generator().manual_seed(100 + ctx.rank)
    x = torch.randn(TOKENS, HIDDEN, generator=g)  # (N, H)
    idx = torch.rand(TOKENS, NUM_EXPERTS, generator=g).topk(TOPK, dim=1).indices  # (N, K)
    w = torch.rand(TOKENS, TOPK, generator=g)  # (N, K)
    res = buf.dispatch(x, idx, w)
    assert res.recv_topk_idx is not None and res.recv_topk_weights is not None
    local = NUM_EXPERTS // ctx.world_size
    scale = 1 + (res.recv_topk_idx + ctx.rank * local).clamp(min=0).float() / 8  # (M, K)
    weight = (res.recv_topk_weights * scale * (res.recv_topk_idx >= 0)).sum(dim=1, keepdim=True)
    out = buf.combine(res.recv_x * weight, res.handle).combined_x  # (N, H)
    return {"rank": ctx.rank, "world": ctx.world_size, "out": out,
            "recv_rows": res.recv_x.shape[0], "kind": buf.path}  # fmt: skip


if __name__ == "__main__":
    out_dir, ranks_per_node = Path(sys.argv[1]), int(sys.argv[2])
    ctx = context_from_env(device="cpu", timeout_s=60)
    result = ep_round(ctx, ranks_per_node)
    torch.save(result, out_dir / f"rank{ctx.rank}.pt")
    torch.distributed.destroy_process_group()
