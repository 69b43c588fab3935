"""A user's model - torch modules, a user-defined expert module, an nn.Linear router - trained
with data x expert parallelism, against one process running the same model on all the data.

Every rank trains on its own shard; ``sync_gradients`` makes each rank's gradient that of the
mean loss over all shards. The reference computes the MoE token by token (each slot's expert
called on its row), with every expert in one process, and steps the same SGD: losses and
parameters must agree after 5 steps (fp32, 1e-5).
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from nobubble.distributed import RankFailure, spawn
from nobubble.moe import Buffer, GroupedExperts, MoEConfig, MoELayer, dp_ep_groups, sync_gradients
from nobubble.moe.parallel import expert_parameters, non_expert_parameters

H, INNER, E, K, CLASSES, ROWS, STEPS, LR = 12, 16, 8, 2, 5, 6, 5, 0.2
CONFIG = MoEConfig(hidden=H, expert_hidden=INNER, num_experts=E, topk=K)


class Expert(nn.Module):
    """The user's expert: a two-layer MLP with a learned gain."""

    def __init__(self, expert_id: int) -> None:
        super().__init__()
        torch.manual_seed(100 + expert_id)  # the same expert on every rank and in the reference
        self.up, self.down = nn.Linear(H, INNER), nn.Linear(INNER, H)
        self.gain = nn.Parameter(torch.ones(H))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(torch.nn.functional.gelu(self.up(x))) * self.gain


class Trunk(nn.Module):
    """Everything but the experts: input layer, norm, router, head."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.inp, self.norm = nn.Linear(4, H), nn.LayerNorm(H)
        self.router = nn.Linear(H, E, bias=False)
        self.head = nn.Linear(H, CLASSES)


class Model(nn.Module):
    """x -> linear -> norm -> x + MoE(x) -> head; the MoE over ``buffer``'s ranks."""

    def __init__(self, buffer: Buffer, ep_rank: int, ep: int) -> None:
        super().__init__()
        self.trunk = Trunk()
        experts = GroupedExperts(Expert, E, rank=ep_rank, num_ranks=ep)
        self.moe = MoELayer(CONFIG, None, buffer, router=self.trunk.router, experts=experts)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.trunk.norm(self.trunk.inp(x))
        return self.trunk.head(h + self.moe(h))


def _data(world: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(7)
    return [(torch.randn(ROWS, 4, generator=g), torch.randint(0, CLASSES, (ROWS,), generator=g))
            for _ in range(world)]  # fmt: skip


def _rank(ctx, dp: int, ep: int) -> dict:
    grid = dp_ep_groups(dp, ep)
    model = Model(Buffer(grid.ep_group, timeout_s=60), grid.ep_rank, ep)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    x, y = _data(ctx.world_size)[ctx.rank]
    losses = []
    for _ in range(STEPS):
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        sync_gradients(model, grid.dp_group, grid.ep_group)
        opt.step()
        opt.zero_grad()
        losses.append(float(loss))
    experts = model.moe.experts
    assert isinstance(experts, GroupedExperts)
    return {
        "losses": losses,
        "trunk": {n: p.detach().clone() for n, p in model.trunk.named_parameters()},
        "experts": {
            experts.first_expert + i: {n: p.detach().clone() for n, p in e.named_parameters()}
            for i, e in enumerate(experts.experts)
        },  # fmt: skip
        "num_expert_params": len(expert_parameters(model)),
        "num_other_params": len(non_expert_parameters(model)),
    }


def _reference(world: int) -> tuple[list[list[float]], Trunk, list[Expert]]:
    """One process, all experts, each slot's expert applied to its row one at a time."""
    trunk, experts = Trunk(), [Expert(e) for e in range(E)]
    params = [*trunk.parameters(), *(p for e in experts for p in e.parameters())]
    opt = torch.optim.SGD(params, lr=LR)
    shards, history = _data(world), []
    for _ in range(STEPS):
        step_losses = []
        for x, y in shards:
            h = trunk.norm(trunk.inp(x))
            probs = trunk.router(h).softmax(dim=-1)
            weights, ids = probs.topk(K, dim=-1)
            rows = []
            for n in range(h.shape[0]):
                rows.append(sum(weights[n, k] * experts[int(ids[n, k])](h[n : n + 1])[0]
                                for k in range(K)))  # fmt: skip
            out = trunk.head(h + torch.stack(rows))
            step_losses.append(nn.functional.cross_entropy(out, y))
        total = sum(step_losses) / world
        total.backward()
        opt.step()
        opt.zero_grad()
        history.append([float(v.detach()) for v in step_losses])
    return history, trunk, experts


@pytest.mark.parametrize(("dp", "ep"), [(1, 4), (2, 2)])  # pure EP, and DP x EP
def test_dp_x_ep_training_equals_one_process(dp: int, ep: int) -> None:
    world = dp * ep
    results = spawn(_rank, world, args=(dp, ep), timeout_s=240)
    history, trunk, experts = _reference(world)
    for rank, res in enumerate(results):
        assert res["losses"] == pytest.approx([h[rank] for h in history], rel=1e-5, abs=1e-6)
        for name, p in trunk.named_parameters():
            torch.testing.assert_close(res["trunk"][name], p.detach(), rtol=1e-5, atol=1e-6)
        for e, params in res["experts"].items():
            for name, p in experts[e].named_parameters():
                torch.testing.assert_close(params[name], p.detach(), rtol=1e-5, atol=1e-6)
        assert res["num_expert_params"] == (E // ep) * 5  # up, down (weight, bias), gain
        assert res["num_other_params"] == 7  # inp (2), norm (2), router (1), head (2)


class _SkipsEmpty(nn.Module):
    """An expert that returns a constant on zero rows (no graph): the layer must cope."""

    def __init__(self, expert_id: int) -> None:
        super().__init__()
        self.lin = nn.Linear(H, H)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.zeros_like(x) if x.shape[0] == 0 else self.lin(x)


def _skips_empty_rank(ctx) -> bool:
    cfg = MoEConfig(hidden=H, expert_hidden=INNER, num_experts=4, topk=1)
    router = nn.Linear(H, 4, bias=False)
    with torch.no_grad():  # every token to expert 0, on rank 0: rank 1's experts get nothing
        router.weight.zero_()
        router.weight[0] += 1.0
    layer = MoELayer(cfg, None, Buffer(timeout_s=30), router=router,
                     experts=GroupedExperts(_SkipsEmpty, 4, rank=ctx.rank, num_ranks=2))  # fmt: skip
    x = torch.ones(3, H, requires_grad=True)
    layer(x).sum().backward()  # reaches combine's and dispatch's backward on both ranks
    return x.grad is not None


def test_experts_that_skip_empty_input_still_backpropagate_on_every_rank() -> None:
    assert spawn(_skips_empty_rank, 2, timeout_s=60) == [True, True]


class _WrongShape(nn.Module):
    def __init__(self, expert_id: int) -> None:
        super().__init__()
        self.lin = nn.Linear(H, H + 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x)


def _wrong_shape_rank(ctx) -> None:
    layer = MoELayer(CONFIG, None, Buffer(timeout_s=30), router=nn.Linear(H, E),
                     experts=GroupedExperts(_WrongShape, E, rank=ctx.rank, num_ranks=2))  # fmt: skip
    layer(torch.randn(4, H))


def test_an_expert_of_the_wrong_shape_is_named() -> None:
    with pytest.raises(RankFailure, match=r"expert module _WrongShape returned \(\d+, 13\)"):
        spawn(_wrong_shape_rank, 2, timeout_s=60)
