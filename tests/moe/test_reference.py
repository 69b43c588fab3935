"""The dispatch / combine reference on its own: independent of what it checks, and right.

The reference must share nothing with the fast paths (no transport, buffer, layout or handle
import), or a bug there would pass every comparison. Its answers are checked against data
that encode their source (``x[n, h] = 1000 * rank + n + h / 64``) and against routing that
every rank can regenerate for every other rank, on 1 rank, 3 ranks (unequal and zero token
counts) and a 2-rank subgroup of the 3.
"""

from __future__ import annotations

import ast
import inspect

import torch
import torch.distributed as dist

import tests.moe.reference as reference_module
from nobubble.distributed import spawn
from tests.moe.reference import reference_combine, reference_dispatch

HIDDEN, TOPK = 6, 3
TOKENS = (5, 0, 7)  # by rank (cycled): rank 1 has no tokens


def test_reference_imports_nothing_it_checks():
    """Only torch and the standard library: no nobubble module at all, so no transport."""
    tree = ast.parse(inspect.getsource(reference_module))
    imported = []
    for node in ast.walk(tree):  # nested imports (TYPE_CHECKING, in functions) included
        if isinstance(node, ast.Import):
            imported += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            imported.append("." * node.level + (node.module or ""))
    assert imported, "parsed no imports: wrong module?"
    for name in imported:
        assert not name.startswith((".", "nobubble")), f"reference.py imports {name}"


def _rank_inputs(src: int, num_experts: int, dtype: torch.dtype):
    """Rank ``src``'s tokens ``[N, H]``, expert ids ``[N, K]`` (with holes), weights ``[N, K]``,
    the same on every rank that asks."""
    n = TOKENS[src % len(TOKENS)]
    g = torch.Generator().manual_seed(100 + src)
    idx = torch.rand(n, num_experts, generator=g).topk(TOPK, dim=1).indices
    idx[torch.rand(idx.shape, generator=g) < 0.3] = -1
    weights = torch.rand(n, TOPK, generator=g)
    token = torch.arange(n, dtype=torch.float32).view(n, 1)
    x = 1000.0 * src + token + torch.arange(HIDDEN, dtype=torch.float32) / 64  # (N, H)
    return x.to(dtype), idx, weights


def _expected(rank: int, world: int, num_experts: int, dtype: torch.dtype) -> dict:
    """What rank ``rank`` must receive, computed from every rank's regenerated inputs."""
    local = num_experts // world
    first = rank * local
    parts: dict[str, list] = {"x": [], "idx": [], "w": [], "src": [], "token": []}
    for src in range(world):
        x, idx, w = _rank_inputs(src, num_experts, dtype)
        mine = (idx >= first) & (idx < first + local)  # (N, K)
        keep = mine.any(dim=1)  # (N,)
        parts["x"].append(x[keep])
        parts["idx"].append(torch.where(mine, idx - first, -1)[keep])
        parts["w"].append(torch.where(mine, w, 0.0)[keep])
        parts["src"].append(torch.full((int(keep.sum()),), src, dtype=torch.int64))
        parts["token"].append(keep.nonzero().view(-1))
    out = {k: torch.cat(v) for k, v in parts.items()}
    out["counts"] = [int((out["idx"] == e).sum()) for e in range(local)]
    return out


def _check(rank: int, world: int, group, dtype: torch.dtype) -> None:
    num_experts = 4 * world
    x, idx, w = _rank_inputs(rank, num_experts, dtype)
    ref = reference_dispatch(x, idx, w, num_experts, group)
    want = _expected(rank, world, num_experts, dtype)
    assert torch.equal(ref.recv_x, want["x"])
    assert torch.equal(ref.recv_topk_idx, want["idx"])
    assert torch.equal(ref.recv_topk_weights, want["w"])
    assert torch.equal(ref.recv_src_rank, want["src"])
    assert torch.equal(ref.recv_src_token, want["token"])
    assert ref.num_recv_tokens_per_expert == want["counts"]
    if dtype == torch.float32:  # each row sent back once per rank that holds it: exact sums
        out = reference_combine(
            ref.recv_x, ref.recv_src_rank, ref.recv_src_token, x.shape[0], group
        )
        local = num_experts // world
        copies = torch.zeros(x.shape[0])
        for r in range(world):
            copies += ((idx >= r * local) & (idx < (r + 1) * local)).any(dim=1).float()
        assert torch.equal(out, x * copies.view(-1, 1))
    without = reference_dispatch(x, idx, None, num_experts, group)
    assert torch.equal(without.recv_x, want["x"])
    assert (without.recv_topk_weights == 0).all()


def _run(ctx) -> str:
    for dtype in (torch.float32, torch.bfloat16):
        _check(ctx.rank, ctx.world_size, None, dtype)
    if ctx.world_size == 3:  # ranks 0 and 2 as a group of two: group ranks, not global ones
        pair = dist.new_group([0, 2])
        if ctx.rank != 1:
            _check(dist.get_rank(pair), 2, pair, torch.float32)
    return "ok"


def test_reference_on_one_and_three_ranks_and_a_subgroup():
    assert spawn(_run, 1, timeout_s=120) == ["ok"]
    assert spawn(_run, 3, timeout_s=120) == ["ok"] * 3
