"""One of four ranks dies or hangs mid-step: detection, naming, and masking.

Each run does a healthy step first, then rank ``DEAD`` vanishes (``os._exit``) or hangs
(``time.sleep``) before dispatch or between dispatch and combine of step 2.

- Without masking every survivor raises :class:`PeerFailure` within the timeout, naming the
  dead rank and the phase, over gloo collectives and over shared memory.
- With ``ShmTransport(mask_failed_ranks=True)`` the survivors finish step 2 and 3; each
  survivor's output equals a reference computed here token by token that skips the dead
  rank's experts (or, with EPLB replicas, re-routes to the surviving replica), and the
  counted drop equals the (token, slot) pairs routed to the dead rank's experts.

The data encode their source and stay exact in float32: integer token rows, weights in
{1/4, 1/2, 1}, expert ``e`` computes ``x * (e + 1) + e``, so outputs compare with
``torch.equal``. Survivors save what they saw to files (the dead rank never reports, so
``spawn`` cannot return normally); the lowest survivor raises ``_AllReported`` once every
reporter's file is there, which ends the job.

``make test`` checks who fails, where, and what each survivor computes; how soon (a failure
within the timeout, a masked step that does not wait) is the long tier's.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
import torch

from nobubble.distributed import RankFailure, spawn
from nobubble.moe import Buffer, PeerFailure, ShmTransport
from tests.support.wait import wait_for

TIMEOUT_S = 5.0
WORLD, DEAD = 4, 2
NUM_TOKENS, HIDDEN = 5, 4
NUM_PHYSICAL = 8  # 2 per rank
IDENTITY = list(range(NUM_PHYSICAL))
# logical expert of each physical one: every logical expert on two ranks (EPLB replicas)
REPLICATED = [0, 1, 2, 3, 1, 0, 3, 2]


class _AllReported(RuntimeError):
    pass


def _data(step: int, rank: int, phy2log: list[int]):
    """``x [N, H]`` integer rows, ``topk_idx [N, K]`` physical ids, ``w [N, K]`` dyadic weights."""
    g = torch.Generator().manual_seed(1000 * step + rank)
    x = torch.randint(-4, 5, (NUM_TOKENS, HIDDEN), generator=g).float()
    num_logical = max(phy2log) + 1
    topk = 3 if num_logical == NUM_PHYSICAL else 2
    logical = torch.stack(
        [torch.randperm(num_logical, generator=g)[:topk] for _ in range(NUM_TOKENS)]
    )
    replicas = {e: [p for p, q in enumerate(phy2log) if q == e] for e in range(num_logical)}
    pick = torch.randint(0, 2, logical.shape, generator=g)
    idx = torch.tensor(
        [[replicas[int(e)][int(c) % len(replicas[int(e)])] for e, c in zip(row, cs)]
         for row, cs in zip(logical, pick)]
    )  # fmt: skip
    w = torch.tensor([0.25, 0.5, 1.0])[torch.randint(0, 3, logical.shape, generator=g)]
    return x, idx, w


def _experts(res, rank: int, phy2log: list[int]) -> torch.Tensor:
    """Each received row through its local experts, weighted (the rank-side expert compute)."""
    local = NUM_PHYSICAL // WORLD
    y = torch.zeros_like(res.recv_x)
    for m in range(res.recv_x.shape[0]):
        for k in range(res.recv_topk_idx.shape[1]):
            lid = int(res.recv_topk_idx[m, k])
            if lid >= 0:
                e = phy2log[rank * local + lid]
                y[m] += res.recv_topk_weights[m, k] * (res.recv_x[m] * (e + 1) + e)
    return y


def _reference(step: int, rank: int, phy2log: list[int], dead: set[int], reroute: bool):
    """Token by token: the sum over slots of w * f_e(x), skipping experts on ``dead`` ranks
    (or counting them on the surviving replica, which computes the same f_e)."""
    x, idx, w = _data(step, rank, phy2log)
    local = NUM_PHYSICAL // WORLD
    out = torch.zeros(NUM_TOKENS, HIDDEN)
    lost = 0
    for n in range(NUM_TOKENS):
        for k in range(idx.shape[1]):
            p = int(idx[n, k])
            e = phy2log[p]
            if p // local in dead:
                alive = [q for q, f in enumerate(phy2log) if f == e and q // local not in dead]
                if not (reroute and alive):
                    lost += 1
                    continue
            out[n] += w[n, k] * (x[n] * (e + 1) + e)
    return out, lost


def _casualty(how: str) -> None:
    if how == "dies":
        os._exit(0)  # vanish without a word (exit code 0: spawn does not kill the others)
    time.sleep(2 * TIMEOUT_S)  # hang past the timeout, then try to carry on


def _finish(ctx, outdir: str, payload: dict, reporters: list[int]) -> str:
    torch.save(payload, Path(outdir) / f"rank{ctx.rank}.pt")
    if ctx.rank == min(reporters):
        wait_for(lambda: all((Path(outdir) / f"rank{r}.pt").exists() for r in reporters),
                 timeout_s=150, what="every reporter saves its result")  # fmt: skip
        raise _AllReported("all reporters saved their results")
    return "reported"


def _run(ctx, kind: str, how: str, where: str, masking: bool, phy2log: list[int], outdir: str):
    if kind == "shm":
        transport = ShmTransport(timeout_s=TIMEOUT_S, mask_failed_ranks=masking)
        buf = Buffer(transport=transport, num_experts=NUM_PHYSICAL)
    else:
        buf = Buffer(num_experts=NUM_PHYSICAL, transport="dist", timeout_s=TIMEOUT_S)
    if phy2log != IDENTITY:
        buf.set_replicas(torch.tensor(phy2log))
    reporters = [r for r in range(WORLD) if r != DEAD or (how == "hangs" and masking)]
    steps: list[dict] = []
    for step in (1, 2, 3):
        x, idx, w = _data(step, ctx.rank, phy2log)
        start = time.monotonic()
        try:
            if step == 2 and ctx.rank == DEAD and where == "dispatch":
                _casualty(how)
            res = buf.dispatch(x, idx, w)
            y = _experts(res, ctx.rank, phy2log)
            if step == 2 and ctx.rank == DEAD and where == "combine":
                _casualty(how)
            out = buf.combine(y, res.handle).combined_x
        except PeerFailure as err:
            failure = {"failed_ranks": err.failed_ranks, "phase": err.phase, "message": str(err)}
            failure["elapsed"] = time.monotonic() - start
            return _finish(ctx, outdir, {"steps": steps, "failure": failure}, reporters)
        stats = buf.masking_stats()
        steps.append({"out": out, "elapsed": time.monotonic() - start, "stats": stats})
    return _finish(ctx, outdir, {"steps": steps, "failure": None}, reporters)


def _spawn(tmp_path, kind, how, where, masking, phy2log=IDENTITY) -> dict[int, dict]:
    with pytest.raises(RankFailure, match="all reporters saved their results"):
        spawn(_run, WORLD, args=(kind, how, where, masking, phy2log, str(tmp_path)), timeout_s=250)
    return {int(p.stem[4:]): torch.load(p, weights_only=False) for p in tmp_path.glob("*.pt")}


@pytest.mark.parametrize(
    "kind,how,where",
    [
        ("dist", "dies", "dispatch"),
        pytest.param("dist", "hangs", "combine", marks=pytest.mark.long),
        pytest.param("shm", "dies", "combine", marks=pytest.mark.long),
        pytest.param("shm", "hangs", "dispatch", marks=pytest.mark.long),
    ],
)
def test_every_survivor_names_the_dead_rank_and_phase(tmp_path, kind, how, where):
    seen = _spawn(tmp_path, kind, how, where, masking=False)
    survivors = [r for r in range(WORLD) if r != DEAD]
    assert survivors == [r for r in sorted(seen) if r != DEAD]
    phase = "layout" if where == "dispatch" else "combine"  # dispatch starts with the layout
    for r in survivors:
        steps, failure = seen[r]["steps"], seen[r]["failure"]
        assert len(steps) == 1 and failure is not None, (r, failure)  # healthy, then failed
        assert failure["failed_ranks"] == (DEAD,), failure["message"]
        assert failure["phase"] == phase, failure["message"]
        assert f"{phase} phase" in failure["message"] and f"[{DEAD}]" in failure["message"]


@pytest.mark.parametrize(
    "how,where,phy2log",
    [
        # rows in flight are lost; step 3 drops at dispatch
        pytest.param("dies", "combine", IDENTITY, marks=pytest.mark.long),
        ("dies", "dispatch", REPLICATED),  # dropped while planning; step 3 uses the replicas
        # masked while asleep; it may not rejoin
        pytest.param("hangs", "combine", IDENTITY, marks=pytest.mark.long),
    ],
)
def test_masking_survivors_finish_the_step_with_the_counted_drop(tmp_path, how, where, phy2log):
    seen = _spawn(tmp_path, "shm", how, where, masking=True, phy2log=phy2log)
    reroute = phy2log != IDENTITY
    for r in [r for r in range(WORLD) if r != DEAD]:
        steps = seen[r]["steps"]
        assert seen[r]["failure"] is None and len(steps) == 3, seen[r]["failure"]
        healthy, _ = _reference(1, r, phy2log, set(), reroute)
        assert torch.equal(steps[0]["out"], healthy)
        assert steps[0]["stats"].num_dropped == 0
        # step 2: the dead rank's slots are dropped (too late to re-route), and counted
        expected, lost = _reference(2, r, phy2log, {DEAD}, reroute=False)
        assert lost > 0
        assert torch.equal(steps[1]["out"], expected), r
        s2 = steps[1]["stats"]
        assert s2.masked_ranks == (DEAD,) and s2.num_dropped == lost and s2.num_rerouted == 0
        assert s2.num_dropped_in_flight == (lost if where == "combine" else 0)
        # step 3: the mask is known before planning: no wait, re-routed or dropped up front
        expected, lost3 = _reference(3, r, phy2log, {DEAD}, reroute)
        assert torch.equal(steps[2]["out"], expected), r
        s3 = steps[2]["stats"]
        rerouted = _reference(3, r, phy2log, {DEAD}, reroute=False)[1] - lost3
        assert (s3.num_dropped - s2.num_dropped, s3.num_rerouted) == (lost3, rerouted)
        assert s3.masked_ranks == (DEAD,) and s3.num_dropped_in_flight == s2.num_dropped_in_flight
    if how == "hangs":  # woke up after the others went on without it: refused, not rejoined
        failure = seen[DEAD]["failure"]
        assert failure is not None and failure["failed_ranks"] == (DEAD,), failure
        assert "masked by its peers" in failure["message"]


@pytest.mark.long
@pytest.mark.parametrize(("kind", "masking"), [("dist", False), ("shm", True)])
def test_a_failure_is_seen_within_the_timeout_and_a_masked_step_does_not_wait(
    tmp_path, kind, masking
):
    """Timing (the long tier): the survivors give up, or mask, within the timeout (+3 s of
    slack); once the mask is known, a step takes under a second."""
    seen = _spawn(tmp_path, kind, "dies", "dispatch", masking=masking)
    for r in [r for r in range(WORLD) if r != DEAD]:
        steps, failure = seen[r]["steps"], seen[r]["failure"]
        if not masking:
            assert failure is not None and failure["elapsed"] < TIMEOUT_S + 3.0, failure
            continue
        assert steps[1]["elapsed"] < TIMEOUT_S + 3.0, steps[1]["elapsed"]
        assert steps[2]["elapsed"] < 1.0, steps[2]["elapsed"]


def test_reroute_and_drop_on_a_small_placement():
    from nobubble.moe.masking import drop_slots_on_ranks, reroute_to_replicas

    idx = torch.tensor([[4, 0], [5, -1], [2, 5]])  # physical ids; rank 2 holds 4, 5
    dropped, n = drop_slots_on_ranks(idx, {2}, 2)
    assert n == 3 and dropped.tolist() == [[-1, 0], [-1, -1], [2, -1]]
    # logical 1 (phys 4) survives as phys 1; logical 0 (phys 5) as phys 0; chosen by token
    new, rerouted, lost = reroute_to_replicas(idx, torch.tensor(REPLICATED), {2}, 2)
    assert (rerouted, lost) == (3, 0) and new.tolist() == [[1, 0], [0, -1], [2, 0]]
    new, rerouted, lost = reroute_to_replicas(idx, torch.tensor(IDENTITY), {2}, 2)
    assert (rerouted, lost) == (0, 3) and new.tolist() == dropped.tolist()


def test_peer_failure_fields_survive_pickling_and_rephasing():
    import pickle

    from nobubble.moe import TransportError
    from nobubble.moe.transport import phase_of

    err = PeerFailure(rank=0, world_size=4, phase="dispatch", operation="all_to_all(x)",
                      failed_ranks=[3, 2], waited_s=5.0, timeout_s=5.0, call=7)  # fmt: skip
    again = pickle.loads(pickle.dumps(err.in_phase("combine")))
    assert isinstance(again, TransportError)
    assert (again.failed_ranks, again.phase, again.call) == ((2, 3), "combine", 7)
    assert "combine phase, all_to_all(x), call 7: rank(s) [2, 3] did not arrive" in str(again)
    kinds = ["layout", "topk_idx", "hier_meta", "x", "ll_combine", "placement"]
    assert [phase_of(k) for k in kinds] == [
        "layout", "layout", "layout", "dispatch", "combine", "rebalance"
    ]  # fmt: skip
