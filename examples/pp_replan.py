"""A pipeline that re-plans under a straggler: rank 1 turns slow mid-run, layers move off it.

    python examples/pp_replan.py [--ranks 2] [--steps 12] [--straggler 1:3:4-]

Every rank builds the whole model (the same seed) and hands its blocks to
``ReplanningPipeline``; each step times every rank's ops, and when rank 1's speed drifts the
ranks agree on a new cut of the blocks, move weights and Adam state, and go on.
"""

import argparse

import torch
from torch import nn

from nobubble.distributed import spawn
from nobubble.pipeline import get_schedule
from nobubble.pipeline.dispatch.perturb import parse_straggler
from nobubble.pipeline.runtime.elastic import ReplanningPipeline


def blocks() -> list[nn.Module]:
    torch.manual_seed(0)
    body = [nn.Sequential(nn.Linear(512, 512), nn.GELU()) for _ in range(12)]
    return [*body, nn.Linear(512, 1)]


def train(ctx, steps: int, straggler: str) -> list[str]:
    schedule = get_schedule("zb-h1", num_ranks=ctx.world_size, num_microbatches=8)
    pipe = ReplanningPipeline(blocks(), schedule, nn.functional.mse_loss,
                              lambda params: torch.optim.Adam(params, lr=1e-3),
                              layer_costs=[1.0] * 12 + [0.01],  # the head is thin
                              straggler=parse_straggler(straggler))  # fmt: skip
    data = torch.Generator().manual_seed(1)
    lines = []
    for step in range(steps):
        x = torch.randn(128, 512, generator=data)  # the same batch on every rank
        y = x[:, :8].sum(dim=1, keepdim=True) / 8**0.5
        loss = float(pipe.step(x, y))
        rec = pipe.history[-1]
        moved = f", re-planned to {rec.replanned_to}" if rec.replanned_to else ""
        lines.append(
            f"step {step}: loss {loss:.3f}, {rec.step_ms:.0f} ms, layers {rec.sizes}{moved}"
        )
    pipe.close()
    return lines


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--straggler", default="1:3:4-", help="RANK:FACTOR[:STEPS]")
    args = ap.parse_args()
    print("\n".join(spawn(train, args.ranks, args=(args.steps, args.straggler))[0]))
