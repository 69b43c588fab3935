"""Gradient aggregation over torch.distributed (3 gloo ranks): sync mean == one learner,
staleness weights, local SGD H=1 == sync, asynchronous apply (the learners' transport and
parameter server) replayed in-process; the
parameter server by hand; global token normalisation summed over workers == one learner."""

from __future__ import annotations

import pytest
import torch

from nobubble.distributed import DistContext, spawn
from nobubble.rl.algo import (
    LocalSGD,
    ParameterServer,
    all_reduce_gradients,
    ppo_policy_loss,
    staleness_weight,
)
from nobubble.rl.algo.aggregation import VersionedInbox, recv_versioned, send_versioned

DIM, BATCH, LR = 4, 12, 0.1


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(DIM, 5), torch.nn.Tanh(), torch.nn.Linear(5, 1)
    ).double()


def _data(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(100 + step)
    return torch.randn(BATCH, DIM, generator=g, dtype=torch.float64), torch.randn(
        BATCH, 1, generator=g, dtype=torch.float64
    )


def _grads(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> list[torch.Tensor]:
    model.zero_grad()
    torch.nn.functional.mse_loss(model(x), y).backward()
    return [p.grad.clone() for p in model.parameters()]


def _shard(x: torch.Tensor, worker: int, num_workers: int) -> slice:
    n = x.shape[0] // num_workers
    return slice(worker * n, (worker + 1) * n)


def _one_learner(steps: int) -> list[torch.Tensor]:
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    for step in range(steps):
        x, y = _data(step)
        _grads(model, x, y)
        opt.step()
    return [p.detach().clone() for p in model.parameters()]


def _assert_params_close(a: list[torch.Tensor], b: list[torch.Tensor]) -> None:
    for x, y in zip(a, b):
        torch.testing.assert_close(x, y, atol=1e-12, rtol=1e-10)


def test_token_mean_with_global_count_summed_over_workers_equals_one_learner() -> None:
    # Uneven token counts per worker: averaging local token-means is biased; summing losses
    # normalised by the global token count is exact.
    g = torch.Generator().manual_seed(5)
    B, T, D = 6, 5, 3
    feats = torch.randn(B, T, D, generator=g, dtype=torch.float64)
    theta0 = torch.randn(D, generator=g, dtype=torch.float64)
    old = (feats * theta0).sum(-1) + 0.2 * torch.randn(B, T, generator=g, dtype=torch.float64)
    adv = torch.randn(B, generator=g, dtype=torch.float64)
    mask = torch.ones(B, T, dtype=torch.float64)
    mask[:3, 1:] = 0  # worker 0 has 3 tokens, worker 1 has 15

    def grad(rows: slice, **kw) -> list[torch.Tensor]:
        theta = theta0.clone().requires_grad_()
        logp = (feats[rows] * theta).sum(-1)  # (b, T)
        ppo_policy_loss(logp, old[rows], adv[rows], mask[rows], **kw).loss.backward()
        return [theta.grad]

    full = grad(slice(0, B))[0]
    shards = (slice(0, 3), slice(3, 6))
    exact = sum(grad(s, global_num_tokens=mask.sum())[0] for s in shards)
    torch.testing.assert_close(exact, full)
    biased = sum(grad(s)[0] for s in shards) / len(shards)
    assert (biased - full).abs().max().item() > 1e-3


def test_parameter_server_async_apply_by_hand() -> None:
    server = ParameterServer(
        [torch.zeros(2, dtype=torch.float64)], lr=0.5, staleness_kind="inverse", max_staleness=1
    )
    va, _ = server.pull()
    vb, _ = server.pull()
    ra = server.push([torch.tensor([1.0, 0.0], dtype=torch.float64)], va)  # fresh: weight 1
    rb = server.push([torch.tensor([0.0, 2.0], dtype=torch.float64)], vb)  # one version old: 1/2
    assert (ra.staleness, ra.weight, rb.staleness, rb.weight) == (0, 1.0, 1, 0.5)
    assert server.params[0].tolist() == pytest.approx([-0.5, -0.5])
    rc = server.push([torch.tensor([9.0, 9.0], dtype=torch.float64)], va)  # two old: dropped
    assert not rc.applied and rc.staleness == 2 and server.version == 2
    with pytest.raises(ValueError, match="base_version=7"):
        server.push([torch.zeros(2)], 7)


def test_parameter_server_without_staleness_is_sequential_sgd() -> None:
    model = _model()
    server = ParameterServer(model.parameters(), lr=LR, staleness_kind="none")
    for step in range(3):
        version, params = server.pull()
        with torch.no_grad():
            for p, q in zip(model.parameters(), params):
                p.copy_(q)
        x, y = _data(step)
        server.push(_grads(model, x, y), version)
    _assert_params_close([p.detach() for p in server.params], _one_learner(3))


def _async_grad(params: list[torch.Tensor], worker: int, step: int) -> list[torch.Tensor]:
    model = _model()
    with torch.no_grad():
        for p, q in zip(model.parameters(), params):
            p.copy_(q)
    x, y = _data(step)
    s = _shard(x, worker - 1, 2)
    return _grads(model, x[s], y[s])


def _async_server(ctx: DistContext, steps: int) -> object:
    """Asynchronous apply over the toolbox's transport (the learners' async path, as a loop):
    rank 0 applies the workers' gradients in arrival order and answers each worker with the
    newest parameters; a worker returns the versions it computed on, rank 0 its log of
    ``(worker, base version, PushResult)`` and the final parameters."""
    params = [p.detach() for p in _model().parameters()]
    if ctx.rank:
        versions = []
        for step in range(steps):
            version, current = recv_versioned(ctx, params, 0)
            versions.append(version)
            send_versioned(ctx, _async_grad(current, ctx.rank, step), version, 0)
        return versions
    server = ParameterServer(params, lr=LR, staleness_kind="inverse")
    inbox = VersionedInbox(ctx, params, (1, 2), per_source=steps)
    log: list[tuple] = []
    for w in (1, 2):
        send_versioned(ctx, server.pull()[1], server.version, w)
    for _ in range(2 * steps):
        w, base, grad = inbox.get()
        log.append((w, base, server.push(grad, base)))
        if [x[0] for x in log].count(w) < steps:
            send_versioned(ctx, server.pull()[1], server.version, w)
    inbox.close()
    return log, [p.detach().clone() for p in server.params]


def _distributed_worker(ctx: DistContext, steps: int) -> dict[str, object]:
    out: dict[str, object] = {}
    for mode in ("sync", "local1", "local2", "weighted"):
        model = _model()
        opt = torch.optim.SGD(model.parameters(), lr=LR)
        local = LocalSGD(model.parameters(), sync_every=2 if mode == "local2" else 1, ctx=ctx)
        for step in range(steps):
            x, y = _data(step)
            s = _shard(x, ctx.rank, ctx.world_size)
            _grads(model, x[s], y[s])
            if mode == "sync":
                all_reduce_gradients(model.parameters(), ctx)
            elif mode == "weighted":
                w = staleness_weight(ctx.rank)
                out["weight"] = all_reduce_gradients(model.parameters(), ctx, weight=w)
                out["weighted_grads"] = [p.grad.clone() for p in model.parameters()]
                _grads(model, x[s], y[s])
                out["sum_weight"] = all_reduce_gradients(model.parameters(), ctx, op="sum")
                out["summed_grads"] = [p.grad.clone() for p in model.parameters()]
                break
            opt.step()
            if mode.startswith("local"):
                local.after_step()
        out[mode] = [p.detach().clone() for p in model.parameters()]
    out["async"] = _async_server(ctx, steps)
    return out


def test_distributed_sync_local_sgd_weighted_and_async_over_gloo() -> None:
    steps, world = 4, 3
    results = spawn(
        _distributed_worker, world, args=(steps,), backend="gloo", device="cpu", timeout_s=120
    )
    reference = _one_learner(steps)
    for r in results:
        _assert_params_close(r["sync"], reference)
        _assert_params_close(r["local1"], reference)
        _assert_params_close(r["local2"], results[0]["local2"])  # averaged after step 4
        assert max((a - b).abs().max().item() for a, b in zip(r["local2"], reference)) > 1e-6
    # staleness-weighted all-reduce: rank r has staleness r -> raw 1, 1/2, 1/3 -> 6/11, 3/11, 2/11
    assert [r["weight"] for r in results] == pytest.approx([6 / 11, 3 / 11, 2 / 11])
    model = _model()
    x, y = _data(0)
    shard_grads = [
        _grads(model, x[_shard(x, w, world)], y[_shard(x, w, world)]) for w in range(world)
    ]
    raw = [1.0, 1 / 2, 1 / 3]  # 1 / (1 + staleness)
    expected = [
        sum(w * g[p] for w, g in zip(raw, shard_grads)) / sum(raw)
        for p in range(len(shard_grads[0]))
    ]
    summed = [sum(g[p] for g in shard_grads) for p in range(len(shard_grads[0]))]
    for r in results:
        _assert_params_close(r["weighted_grads"], expected)
        _assert_params_close(r["summed_grads"], summed)  # op="sum": no weights, no division
        assert r["sum_weight"] == 1.0
    _check_async_log(results, steps)


def _check_async_log(results: list[dict[str, object]], steps: int) -> None:
    """Replay the server's arrival order in-process: same staleness, weights and params."""
    log, params = results[0]["async"]
    assert sorted(w for w, _, _ in log) == [1] * steps + [2] * steps
    for w in (1, 2):
        assert results[w]["async"] == [base for who, base, _ in log if who == w]
    replay = ParameterServer(_model().parameters(), lr=LR, staleness_kind="inverse")
    history = {0: replay.pull()[1]}
    done = {1: 0, 2: 0}
    for w, base, push in log:
        again = replay.push(_async_grad(history[base], w, done[w]), base)
        assert again == push and push.weight == pytest.approx(1 / (1 + push.staleness))
        history[again.version] = replay.pull()[1]
        done[w] += 1
    _assert_params_close(params, [p.detach() for p in replay.params])


def test_bad_input() -> None:
    ctx = DistContext(0, 2, "gloo", torch.device("cpu"))
    with pytest.raises(ValueError, match="sync_every=0"):
        LocalSGD([torch.zeros(1)], sync_every=0, ctx=ctx)
    with pytest.raises(ValueError, match="op='max'"):
        all_reduce_gradients([], ctx, op="max")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="base_version=1 is newer"):
        ParameterServer([torch.zeros(1)]).push([torch.zeros(1)], 1)
