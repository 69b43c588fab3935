"""Train a small GPT written with plain torch.nn, split over pipeline ranks, with any schedule.

The model is defined here (embedding, causal TransformerEncoderLayer blocks, a linear head);
the text is the standard library's own docstrings, so nothing is downloaded. Each rank builds
the same model from one seed, keeps its stages, and runs the same loop:

    python examples/train_gpt.py --ranks 2 --schedule zb-2p --steps 30
    python examples/train_gpt.py --ranks 4 --schedule zb-v --steps 30
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from torch import nn

from nobubble.bench.ep_train import corpus  # the standard library's docstrings, ~100 KB
from nobubble.distributed import spawn
from nobubble.pipeline import PipelineRunner, get_schedule, split_model

SEQ, HIDDEN, HEADS, LAYERS = 64, 64, 4, 6  # 8 blocks: up to 8 stages (zb-v on 4 ranks)


class CausalBlock(nn.Module):
    """One pre-norm transformer block that sees only earlier positions: (B, T, H) -> (B, T, H)."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.TransformerEncoderLayer(
            HIDDEN, HEADS, 4 * HIDDEN, dropout=0.0, batch_first=True, norm_first=True
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mask = nn.Transformer.generate_square_subsequent_mask(x.shape[1], device=x.device)
        return self.layer(x, src_mask=mask, is_causal=True)


class Embed(nn.Module):
    """Token plus position embedding: (B, T) int64 -> (B, T, H)."""

    def __init__(self, vocab: int) -> None:
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, HIDDEN), nn.Embedding(SEQ, HIDDEN)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.tok(ids) + self.pos(torch.arange(ids.shape[1], device=ids.device))


def gpt(vocab: int) -> nn.Sequential:
    torch.manual_seed(0)
    head = nn.Sequential(nn.LayerNorm(HIDDEN), nn.Linear(HIDDEN, vocab))
    return nn.Sequential(Embed(vocab), *[CausalBlock() for _ in range(LAYERS)], head)


def loss_fn(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def rank_main(ctx, schedule_name: str, steps: int, batch: int, microbatches: int) -> dict:
    text = corpus()
    chars = sorted(set(text))
    data = torch.tensor([chars.index(c) for c in text])
    sched = get_schedule(schedule_name, num_ranks=ctx.world_size, num_microbatches=microbatches)
    stages = split_model(gpt(len(chars)), sched.num_stages)
    runner = PipelineRunner(stages, sched, loss_fn)
    params = [p for m in runner.stage_modules.values() for p in m.parameters()]
    opt = torch.optim.AdamW(params, lr=3e-3)
    g = torch.Generator().manual_seed(1)
    losses, times = [], []
    for _ in range(steps):
        start = torch.randint(0, len(data) - SEQ - 1, (batch,), generator=g)
        window = torch.stack([data[s : s + SEQ + 1] for s in start.tolist()])  # (B, T + 1)
        t0 = time.perf_counter()
        loss = runner.step(window[:, :-1], window[:, 1:])
        opt.step()
        opt.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - t0)
        losses.append(float(loss))
    runner.close()
    return {"losses": losses, "step_s": statistics.median(times[1:] or times)}


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--schedule", default="zb-2p")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--microbatches", type=int, default=4)
    args = p.parse_args(argv)
    res = spawn(rank_main, args.ranks, args=(args.schedule, args.steps, args.batch,
                args.microbatches), timeout_s=1800)[0]  # fmt: skip
    first, last = res["losses"][0], res["losses"][-1]
    print(f"{args.schedule} on {args.ranks} ranks: loss {first:.3f} -> {last:.3f} in "
          f"{args.steps} steps, median step {1e3 * res['step_s']:.0f} ms")  # fmt: skip
    return res


if __name__ == "__main__":
    main()
