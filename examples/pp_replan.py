"""A pipeline that re-plans under a straggler: rank 1 turns slow mid-run, layers move off it.

    python examples/pp_replan.py [--ranks 2] [--steps 12] [--straggler 1:3:4-]

Every rank builds the whole model (the same seed) and hands its blocks to a ``Replanner``,
a hook of the ``PipelineRunner``; each step times every rank's ops, and when rank 1's speed
drifts the ranks agree on a new cut of the blocks, move weights and Adam state between two
steps, re-stage the runner, and go on. ``StragglerObserver`` really slows rank 1.
"""

import argparse

import torch
from torch import nn

from nobubble.distributed import spawn
from nobubble.pipeline import PipelineRunner, get_schedule
from nobubble.pipeline.dispatch.perturb import parse_straggler
from nobubble.pipeline.runtime.elastic import Replanner
from nobubble.pipeline.runtime.hooks import StragglerObserver


def blocks() -> list[nn.Module]:
    torch.manual_seed(0)
    body = [nn.Sequential(nn.Linear(512, 512), nn.GELU()) for _ in range(12)]
    return [*body, nn.Linear(512, 1)]


def train(ctx, steps: int, straggler: str) -> list[str]:
    schedule = get_schedule("zb-h1", num_ranks=ctx.world_size, num_microbatches=8)
    replan = Replanner(
        blocks(),
        schedule,
        lambda params: torch.optim.Adam(params, lr=1e-3),
        layer_costs=[1.0] * 12 + [0.01],
    )  # the head is thin
    runner = PipelineRunner(replan.stages(), schedule, nn.functional.mse_loss, hooks=[replan],
                            observer=StragglerObserver(parse_straggler(straggler)))  # fmt: skip
    data = torch.Generator().manual_seed(1)
    lines = []
    for step in range(steps):
        x = torch.randn(128, 512, generator=data)  # the same batch on every rank
        y = x[:, :8].sum(dim=1, keepdim=True) / 8**0.5
        loss = float(runner.step(x, y))
        replan.optimizer.step()  # a re-plan rebuilds it: take it from the replanner
        replan.optimizer.zero_grad(set_to_none=True)
        rec = replan.history[-1]
        moved = f", re-planned to {rec.replanned_to}" if rec.replanned_to else ""
        lines.append(
            f"step {step}: loss {loss:.3f}, {rec.step_ms:.0f} ms, layers {rec.sizes}{moved}"
        )
    runner.close()
    return lines


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--straggler", default="1:3:4-", help="RANK:FACTOR[:STEPS]")
    args = ap.parse_args()
    print("\n".join(spawn(train, args.ranks, args=(args.steps, args.straggler))[0]))
