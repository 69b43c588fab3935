"""Pipeline x expert parallelism: a MoE-GPT in 2 pipeline stages, each stage's experts split
over 2 ranks, trained with a zero-bubble schedule on 4 processes.

World rank ``r`` holds pipeline stage ``r // 2`` and is expert-parallel rank ``r % 2`` of that
stage: ranks {0, 2} form one pipeline and {1, 3} the other, each training on its own batches
of the standard library's docstrings. Stage 0 is the embedding and the first block, stage 1
the second block and the head; every block's FFN is a MoE layer whose routed experts live on
the stage's two ranks and exchange tokens in the stage's group. ``PipelineRunner`` runs the
schedule on each pipeline's subgroup; ``sync_gradients`` over the stage's group makes both
pipelines train one model (data parallel across the pipelines):

    python examples/train_pp_ep.py --steps 30 --schedule zb-h1
"""

from __future__ import annotations

import argparse

import torch
import torch.distributed as dist
from torch import nn

from nobubble.bench.ep_train import MoEGPT, TrainConfig, loss_fn, make_batches
from nobubble.distributed import spawn
from nobubble.moe import Buffer, MoELayer, sync_gradients
from nobubble.pipeline import PipelineRunner, get_schedule

SIZES = dict(hidden=32, expert_hidden=32, num_experts=8, topk=2, num_layers=2, seq_len=32,
             batch_size=8, lr=3e-3)  # fmt: skip


class First(nn.Module):
    """Stage 0: token + position embedding, then block 0: (B, T) ids -> (B, T, H)."""

    def __init__(self, model: MoEGPT) -> None:
        super().__init__()
        self.tok, self.pos, self.block = model.tok, model.pos, model.blocks[0]

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.tok(ids) + self.pos(torch.arange(ids.shape[1], device=ids.device))
        return self.block(x)


class Last(nn.Module):
    """Stage 1: block 1, then the head: (B, T, H) -> (B, T, V) logits."""

    def __init__(self, model: MoEGPT) -> None:
        super().__init__()
        self.block, self.head = model.blocks[1], model.head

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.block(x))


def rank_main(ctx, config: TrainConfig, schedule_name: str, microbatches: int) -> list[float]:
    """This rank's stage of its pipeline; returns the pipeline's loss per step."""
    stage, ep_rank = divmod(ctx.rank, 2)
    ep_groups = [dist.new_group([0, 1]), dist.new_group([2, 3])]  # every rank makes every group
    pipelines = [dist.new_group([0, 2]), dist.new_group([1, 3])]
    ep_group, pipeline = ep_groups[stage], pipelines[ep_rank]
    vocab, windows = make_batches(config)  # (steps, pipelines, batch, seq_len + 1) char ids
    with Buffer(ep_group, timeout_s=120) as buffer:  # shared memory released at the end
        model = MoEGPT(
            config, vocab, lambda weights: MoELayer(config.moe_config(), weights, buffer)
        )
        module = First(model) if stage == 0 else Last(model)  # the blocks of the other stage idle
        schedule = get_schedule(schedule_name, num_ranks=2, num_microbatches=microbatches)
        stages: list[nn.Module | None] = [module if s == stage else None for s in range(2)]
        runner = PipelineRunner(stages, schedule, loss_fn, group=pipeline, timeout_s=120)
        opt = torch.optim.AdamW(module.parameters(), lr=config.lr)
        losses = []
        for step in range(config.num_steps):
            batch = windows[step, ep_rank]  # pipeline p = ep_rank trains on its own batch
            loss = runner.step(batch[:, :-1] if stage == 0 else None,
                               batch[:, 1:] if stage == 1 else None)  # fmt: skip
            sync_gradients(module, None, ep_group, group=ep_group)  # both pipelines, one model
            opt.step()
            opt.zero_grad()
            losses.append(float(loss))
    runner.close()
    return losses


def main(argv: list[str] | None = None) -> list[float]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--schedule", default="zb-h1", help="any 2-rank schedule (1f1b, zb-h1, ...)")
    p.add_argument("--microbatches", type=int, default=4)
    args = p.parse_args(argv)
    config = TrainConfig(num_ranks=2, num_steps=args.steps, **SIZES)  # 2 pipelines' batches
    per_rank = spawn(rank_main, 4, args=(config, args.schedule, args.microbatches),
                     timeout_s=1800)  # fmt: skip
    losses = [(a + b) / 2 for a, b in zip(per_rank[0], per_rank[1], strict=True)]
    print(f"PP=2 x EP=2 on 4 ranks, {args.schedule}: loss {losses[0]:.4f} -> "
          f"{losses[-1]:.4f} in {args.steps} steps")  # fmt: skip
    return losses


if __name__ == "__main__":
    main()
