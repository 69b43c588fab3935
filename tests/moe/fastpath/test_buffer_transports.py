"""One Buffer for every transport: "auto" takes shared memory for gloo on one CPU host, "dist"
gloo collectives, a transport object its own declared capabilities; all move the same bits;
a bad kind names itself; ``with Buffer(...)`` releases the shared memory on exit."""

from __future__ import annotations

import glob

import pytest
import torch

from nobubble.distributed import spawn
from nobubble.moe import Buffer, ShmTransport, Topology
from nobubble.moe.transport import Capabilities


def _run(ctx) -> str:
    auto = Buffer(None, 8, timeout_s=30)
    plain = Buffer(None, 8, transport="dist", timeout_s=30)
    shm = Buffer(None, 8, transport="shm", timeout_s=30)
    given = Buffer(None, 8, transport=ShmTransport(timeout_s=30, capacity_bytes_per_peer=64))
    assert auto.path == "peer_writes" and auto.transport.kind == "shm"
    assert shm.path == "peer_writes" and shm.num_experts == 8
    assert plain.path == "collective" and plain.transport.kind == "dist"
    assert plain.num_experts == 8 and plain.transport.timeout_s == 30
    assert given.path == "peer_writes"
    g = torch.Generator().manual_seed(11 + ctx.rank)
    n = 9 + 4 * ctx.rank
    topk_idx = torch.rand(n, 8, generator=g).topk(3, dim=1).indices  # (N, 3)
    topk_weights = torch.rand(n, 3, generator=g)
    for dtype in (torch.float32, torch.bfloat16):
        x = torch.randn(n, 16, generator=g).to(dtype)
        results = []
        for buf in (auto, shm, given, plain):
            res = buf.dispatch(x, topk_idx, topk_weights)
            y = (res.recv_x.float() * 1.5).to(dtype)  # an expert that changes the rows
            comb = buf.combine(y, res.handle, topk_weights=res.recv_topk_weights)
            results.append((res.recv_x, res.recv_topk_weights, comb.combined_x))
        for got in results[:3]:
            for a, b in zip(got, results[3], strict=True):
                assert torch.equal(a, b), dtype
    keys = [auto.transport._key, shm.transport._key, given.transport._key]
    for buf in (auto, shm, given, plain):
        buf.close()
    torch.distributed.barrier()
    return ",".join(keys)


def test_every_transport_kind_moves_the_same_bits():
    keys = spawn(_run, 2, timeout_s=120)
    assert len(set(keys)) == 1
    for key in keys[0].split(","):
        assert glob.glob(f"/dev/shm/nobubble-ep-{key}-*") == []  # no names left behind


def _shm_mappings() -> list[str]:
    """This process's mappings of nobubble's shared-memory segments (/proc/self/maps)."""
    with open("/proc/self/maps") as maps:
        return [line for line in maps if "nobubble-ep-" in line]


def _with_block(ctx) -> dict:
    import gc

    assert _shm_mappings() == []
    with Buffer(None, 4, transport=ShmTransport(timeout_s=30, capacity_bytes_per_peer=64)) as buf:
        key = buf.transport._key
        x = torch.full((40, 256), float(ctx.rank))  # 40 KiB rows: the 64-byte slots grow
        res = buf.dispatch(x, torch.tensor([[1, 3]] * 40))  # ends on the grown region
        assert torch.equal(res.recv_x[:40], torch.zeros(40, 256))
        mapped_inside = len(_shm_mappings())
        named_inside = glob.glob(f"/dev/shm/nobubble-ep-{key}-*")
    del res
    gc.collect()
    after = {"mapped": _shm_mappings(), "named": glob.glob(f"/dev/shm/nobubble-ep-{key}-*")}
    with pytest.raises(ValueError, match="the Buffer is closed; build a new one"):
        buf.dispatch(x, torch.tensor([[1, 3]] * 40))
    torch.distributed.barrier()
    return {"mapped_inside": mapped_inside, "named_inside": named_inside, **after}


def test_with_block_releases_the_shared_memory():
    """Inside the block the segments are mapped (and the grown region still named, its peers
    not having re-mapped it yet); after it, this rank maps none and names none."""
    for result in spawn(_with_block, 2, timeout_s=120):
        assert result["mapped_inside"] > 0
        assert result["named_inside"] != []
        assert result["mapped"] == [], result["mapped"]
        assert result["named"] == [], result["named"]


class _Loop:
    """A world-of-one transport with no fast paths (no ``capabilities`` attribute)."""

    rank, world_size, kind = 0, 1, "loop"

    def all_to_all(self, send, send_splits, recv_splits, *, kind):
        return send.clone()

    def close(self) -> None:
        pass


class _DeclaresSplit(_Loop):
    capabilities = Capabilities(split_all_to_all=True)


def test_the_path_follows_declared_capabilities_not_the_class():
    assert Buffer(transport=_Loop()).path == "collective"  # type: ignore[arg-type]
    buf = Buffer(transport=_DeclaresSplit())  # type: ignore[arg-type]
    assert buf.path == "collective"  # split all-to-all is for low latency; payload: collective
    x = torch.arange(12.0).view(3, 4)
    res = buf.dispatch(x, torch.tensor([[0], [1], [0]]), num_experts=2)
    assert torch.equal(buf.combine(res.recv_x, res.handle).combined_x, x)


def test_bad_kind_names_it_and_the_choices():
    with pytest.raises(ValueError, match=r"kind='bogus'; choose one of \('auto', 'shm', 'dist'\)"):
        Buffer(transport="bogus")


@pytest.mark.parametrize("bad", [-1, 1.5, True])
def test_bad_recycle_outputs_is_refused_before_any_shared_memory_exists(bad):
    with pytest.raises(ValueError, match=f"recycle_outputs={bad!r} must be an int >= 0"):
        Buffer(recycle_outputs=bad)


def test_a_transport_object_with_topology_is_refused():
    with pytest.raises(ValueError, match="with topology=, pass transport as a kind"):
        Buffer(transport=_Loop(), topology=Topology(ranks_per_node=1))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="ranks_per_node=0 must be an int >= 1"):
        Topology(ranks_per_node=0)
