"""Gradient aggregation: sync mean == one learner, staleness weights, local SGD H=1 == sync,
asynchronous apply; in-process and over torch.distributed (2 gloo ranks)."""

from __future__ import annotations

import pytest
import torch

from nobubble.distributed import DistContext, spawn
from nobubble.rl import (
    LocalSGD,
    ParameterServer,
    all_reduce_gradients,
    mean_gradients,
    ppo_policy_loss,
    run_async_parameter_server,
    staleness_weight,
    staleness_weighted_gradients,
    sum_gradients,
)

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


def _sync_in_process(num_workers: int, steps: int) -> list[torch.Tensor]:
    model = _model()
    for step in range(steps):
        x, y = _data(step)
        worker_grads = [
            _grads(model, x[s], y[s])
            for s in (_shard(x, w, num_workers) for w in range(num_workers))
        ]
        agg = mean_gradients(worker_grads)
        with torch.no_grad():
            for p, g in zip(model.parameters(), agg.grads):
                p -= LR * g
    return [p.detach().clone() for p in model.parameters()]


def _local_sgd_in_process(num_workers: int, steps: int, sync_every: int) -> list[torch.Tensor]:
    models = [_model() for _ in range(num_workers)]
    opts = [torch.optim.SGD(m.parameters(), lr=LR) for m in models]
    local = LocalSGD(sync_every=sync_every, worker_params=[list(m.parameters()) for m in models])
    for step in range(steps):
        x, y = _data(step)
        for w, (m, opt) in enumerate(zip(models, opts)):
            s = _shard(x, w, num_workers)
            _grads(m, x[s], y[s])
            opt.step()
        local.after_step()
    return [p.detach().clone() for p in models[0].parameters()]


def _assert_params_close(a: list[torch.Tensor], b: list[torch.Tensor]) -> None:
    for x, y in zip(a, b):
        torch.testing.assert_close(x, y, atol=1e-12, rtol=1e-10)


def test_sync_mean_equals_one_learner_on_combined_batch() -> None:
    _assert_params_close(_sync_in_process(3, steps=4), _one_learner(4))


def test_local_sgd_h1_equals_synchronous_and_h2_does_not() -> None:
    sync = _sync_in_process(3, steps=4)
    _assert_params_close(_local_sgd_in_process(3, 4, sync_every=1), sync)
    h2 = _local_sgd_in_process(3, 4, sync_every=2)
    assert max((a - b).abs().max().item() for a, b in zip(h2, sync)) > 1e-6


def test_staleness_weighting_gives_stated_weights() -> None:
    grads = [[torch.tensor([1.0, 0.0])], [torch.tensor([0.0, 1.0])], [torch.tensor([1.0, 1.0])]]
    agg = staleness_weighted_gradients(grads, staleness=[0, 1, 3])
    # raw 1/(1+s) = [1, 1/2, 1/4], normalised by 7/4 -> [4/7, 2/7, 1/7]
    assert agg.weights.tolist() == pytest.approx([4 / 7, 2 / 7, 1 / 7])
    assert agg.grads[0].tolist() == pytest.approx([5 / 7, 3 / 7])
    assert mean_gradients(grads).weights.tolist() == pytest.approx([1 / 3] * 3)


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

    full = grad(slice(0, B))
    shards = (slice(0, 3), slice(3, 6))
    exact = sum_gradients([grad(s, global_num_tokens=mask.sum()) for s in shards])
    torch.testing.assert_close(exact[0], full[0])
    biased = mean_gradients([grad(s) for s in shards])
    assert (biased.grads[0] - full[0]).abs().max().item() > 1e-3


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


def _distributed_worker(ctx: DistContext, steps: int) -> dict[str, object]:
    out: dict[str, object] = {}
    for mode in ("sync", "local1", "weighted"):
        model = _model()
        opt = torch.optim.SGD(model.parameters(), lr=LR)
        local = LocalSGD(model.parameters(), sync_every=1, ctx=ctx)
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
                break
            opt.step()
            if mode == "local1":
                local.after_step()
        out[mode] = [p.detach().clone() for p in model.parameters()]
    initial = [p.detach() for p in _model().parameters()]
    out["async"] = run_async_parameter_server(ctx, initial, _async_grad, num_pushes=steps, lr=LR)
    return out


def test_distributed_sync_local_sgd_weighted_and_async_over_gloo() -> None:
    steps, world = 3, 3
    results = spawn(
        _distributed_worker, world, args=(steps,), backend="gloo", device="cpu", timeout_s=120
    )
    reference = _one_learner(steps)
    for r in results:
        _assert_params_close(r["sync"], reference)
        _assert_params_close(r["local1"], reference)
    # staleness-weighted all-reduce: rank r has staleness r -> raw 1, 1/2, 1/3 -> 6/11, 3/11, 2/11
    assert [r["weight"] for r in results] == pytest.approx([6 / 11, 3 / 11, 2 / 11])
    model = _model()
    x, y = _data(0)
    shard_grads = [
        _grads(model, x[_shard(x, w, world)], y[_shard(x, w, world)]) for w in range(world)
    ]
    expected = staleness_weighted_gradients(shard_grads, staleness=[0, 1, 2]).grads
    for r in results:
        _assert_params_close(r["weighted_grads"], expected)
    _check_async_log(results, steps)


def _check_async_log(results: list[dict[str, object]], steps: int) -> None:
    """Replay the server's arrival order in-process: same staleness, weights and params."""
    log = results[0]["async"]
    assert sorted(log.workers) == [1] * steps + [2] * steps
    for w in (1, 2):
        mine = [b for b, who in zip(log.base_versions, log.workers) if who == w]
        assert results[w]["async"].base_versions == mine
    replay = ParameterServer(_model().parameters(), lr=LR, staleness_kind="inverse")
    history = {0: replay.pull()[1]}
    done = {1: 0, 2: 0}
    for w, base, push in zip(log.workers, log.base_versions, log.pushes):
        again = replay.push(_async_grad(history[base], w, done[w]), base)
        assert again == push and push.weight == pytest.approx(1 / (1 + push.staleness))
        history[again.version] = replay.pull()[1]
        done[w] += 1
    _assert_params_close(log.params, [p.detach() for p in replay.params])


def test_bad_input() -> None:
    with pytest.raises(ValueError, match="worker 1 has gradient shapes"):
        mean_gradients([[torch.zeros(2)], [torch.zeros(3)]])
    with pytest.raises(ValueError, match="weights="):
        mean_gradients([[torch.zeros(2)]], [-1.0])
    with pytest.raises(ValueError, match="sync_every=0"):
        LocalSGD(sync_every=0, worker_params=[[torch.zeros(1)]])
    with pytest.raises(ValueError, match="2 staleness values for 1 workers"):
        staleness_weighted_gradients([[torch.zeros(1)]], [0, 1])
