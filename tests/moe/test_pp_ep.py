"""Expert parallelism inside pipeline stages: PP=2 x EP=2 on 4 gloo ranks.

World rank ``r`` holds pipeline stage ``r // 2`` and is expert-parallel rank ``r % 2`` of
that stage; the ranks ``{0, 2}`` form one pipeline and ``{1, 3}`` the other, each training on
its own batch. Each stage is a block ``x + MoE(norm(x))`` with a user-defined expert module
and an ``nn.Linear`` router, split over the stage's two ranks. A ``PipelineRunner`` on each
pipeline's subgroup runs the schedule; the MoE layers exchange tokens inside their stage's
group; ``sync_gradients`` over the stage's group averages the two pipelines.

The reference is one process: the whole model, every expert, the MoE computed token by token,
the mean of the two pipelines' losses. Losses, gradients and the parameters after 3 SGD steps
must agree within 1e-5 (fp32).
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch import nn

from nobubble.distributed import spawn
from nobubble.moe import Buffer, GroupedExperts, MoEConfig, MoELayer, sync_gradients
from nobubble.pipeline import PipelineRunner, get_schedule

H, INNER, E, K, IN, CLASSES = 12, 16, 4, 2, 4, 5
ROWS, MICROBATCHES, STEPS, LR = 8, 4, 3, 0.2
CONFIG = MoEConfig(hidden=H, expert_hidden=INNER, num_experts=E, topk=K)


class Expert(nn.Module):
    """The user's expert: a two-layer MLP with a learned gain."""

    def __init__(self, stage: int, expert_id: int) -> None:
        super().__init__()
        torch.manual_seed(100 * (stage + 1) + expert_id)  # same expert everywhere
        self.up, self.down = nn.Linear(H, INNER), nn.Linear(INNER, H)
        self.gain = nn.Parameter(torch.ones(H))

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (M, H) -> (M, H)
        return self.down(nn.functional.gelu(self.up(x))) * self.gain


class Dense(nn.Module):
    """A stage without its experts: the input or output layer, a norm, the router."""

    def __init__(self, stage: int) -> None:
        super().__init__()
        torch.manual_seed(stage)
        self.edge = nn.Linear(IN, H) if stage == 0 else nn.Linear(H, CLASSES)
        self.norm = nn.LayerNorm(H)
        self.router = nn.Linear(H, E, bias=False)


class Stage(nn.Module):
    """Stage 0: ``x -> linear -> x + MoE(norm x)``; stage 1: ``x + MoE(norm x) -> head``."""

    def __init__(self, stage: int, buffer: Buffer, ep_rank: int) -> None:
        super().__init__()
        self.stage, self.dense = stage, Dense(stage)
        experts = GroupedExperts(lambda e: Expert(stage, e), E, rank=ep_rank, num_ranks=2)
        self.moe = MoELayer(CONFIG, None, buffer, router=self.dense.router, experts=experts)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.stage == 0:
            x = self.dense.edge(x)  # (N, IN) -> (N, H)
        x = x + self.moe(self.dense.norm(x))
        return x if self.stage == 0 else self.dense.edge(x)


def _data() -> list[tuple[torch.Tensor, torch.Tensor]]:
    """One batch per pipeline."""
    g = torch.Generator().manual_seed(11)
    return [(torch.randn(ROWS, IN, generator=g), torch.randint(0, CLASSES, (ROWS,), generator=g))
            for _ in range(2)]  # fmt: skip


def _rank(ctx, schedule_name: str) -> dict:
    stage, ep_rank = divmod(ctx.rank, 2)
    # every rank creates every group, in one order
    ep_groups = [dist.new_group([0, 1]), dist.new_group([2, 3])]
    pipelines = [dist.new_group([0, 2]), dist.new_group([1, 3])]
    ep_group, pipeline = ep_groups[stage], pipelines[ep_rank]
    module = Stage(stage, Buffer(ep_group, timeout_s=60), ep_rank)
    schedule = get_schedule(schedule_name, num_ranks=2, num_microbatches=MICROBATCHES)
    stages: list[nn.Module | None] = [module if s == stage else None for s in range(2)]
    runner = PipelineRunner(stages, schedule, nn.functional.cross_entropy,
                            group=pipeline, timeout_s=60)  # fmt: skip
    opt = torch.optim.SGD(module.parameters(), lr=LR)
    x, y = _data()[ep_rank]
    losses, first_grads = [], {}
    for step in range(STEPS):
        loss = runner.step(x if stage == 0 else None, y if stage == 1 else None)
        sync_gradients(module, None, ep_group, group=ep_group)
        if step == 0:
            first_grads = {n: p.grad.clone() for n, p in _named(module) if p.grad is not None}
        opt.step()
        opt.zero_grad()
        losses.append(float(loss))
    report = runner.split_report()[stage]
    runner.close()
    return {
        "stage": stage,
        "losses": losses,
        "grads": first_grads,
        "params": {n: p.detach().clone() for n, p in _named(module)},
        "first_expert": module.moe.experts.first_expert,  # type: ignore[union-attr]
        "deferred": None if report is None else report.deferred_fraction,
    }


def _named(module: Stage):
    """Parameters by reference name: ``dense.*`` and ``expert{global id}.*``."""
    experts = module.moe.experts
    assert isinstance(experts, GroupedExperts)
    yield from (("dense." + n, p) for n, p in module.dense.named_parameters())
    for i, e in enumerate(experts.experts):
        yield from ((f"expert{experts.first_expert + i}.{n}", p) for n, p in e.named_parameters())


def _moe(dense: Dense, experts: list[Expert], h: torch.Tensor) -> torch.Tensor:
    """Token by token: softmax top-k of the router, each slot's expert on its row."""
    weights, ids = dense.router(h).softmax(dim=-1).topk(K, dim=-1)
    rows = [sum(weights[n, k] * experts[int(ids[n, k])](h[n : n + 1])[0] for k in range(K))
            for n in range(h.shape[0])]  # fmt: skip
    return torch.stack(rows)


def _reference() -> tuple[list[float], list[dict], list[dict]]:
    """Mean loss per step, first-step gradients and final parameters, per stage."""
    dense = [Dense(0), Dense(1)]
    experts = [[Expert(s, e) for e in range(E)] for s in range(2)]

    def named(s: int):
        yield from (("dense." + n, p) for n, p in dense[s].named_parameters())
        for e, ex in enumerate(experts[s]):
            yield from ((f"expert{e}.{n}", p) for n, p in ex.named_parameters())

    params = [p for s in range(2) for _, p in named(s)]
    opt = torch.optim.SGD(params, lr=LR)
    losses, grads = [], []
    for step in range(STEPS):
        total = torch.zeros(())
        for x, y in _data():
            h = dense[0].edge(x)
            h = h + _moe(dense[0], experts[0], dense[0].norm(h))
            h = h + _moe(dense[1], experts[1], dense[1].norm(h))
            total = total + nn.functional.cross_entropy(dense[1].edge(h), y) / 2
        total.backward()
        if step == 0:
            grads = [{n: p.grad.clone() for n, p in named(s) if p.grad is not None}
                     for s in range(2)]  # fmt: skip
        opt.step()
        opt.zero_grad()
        losses.append(float(total.detach()))
    return losses, grads, [{n: p.detach().clone() for n, p in named(s)} for s in range(2)]


@pytest.mark.parametrize("schedule_name", ["1f1b", "zb-h1"])
def test_pp_x_ep_on_four_ranks_equals_one_process(schedule_name: str) -> None:
    results = spawn(_rank, 4, args=(schedule_name,), timeout_s=240)
    losses, grads, params = _reference()
    for rank, res in enumerate(results):
        stage = res["stage"]
        assert stage == rank // 2
        # each pipeline's loss is its own batch's; their mean is the reference loss
        other = results[rank ^ 1]["losses"]
        mean = [(a + b) / 2 for a, b in zip(res["losses"], other, strict=True)]
        assert mean == pytest.approx(losses, rel=1e-5, abs=1e-6)
        assert set(res["grads"]) <= set(grads[stage]) and len(res["grads"]) > 0
        for name, g in res["grads"].items():
            torch.testing.assert_close(g, grads[stage][name], rtol=1e-5, atol=1e-6, msg=name)
        for name, p in res["params"].items():
            torch.testing.assert_close(p, params[stage][name], rtol=1e-5, atol=1e-6, msg=name)
        # this rank's half of the experts, every dense parameter
        assert res["first_expert"] == (rank % 2) * (E // 2)
        assert sum(n.startswith("expert") for n in res["params"]) == (E // 2) * 5
        if schedule_name == "zb-h1":
            assert res["deferred"] == 1.0  # every weight gradient waited for W
