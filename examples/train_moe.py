"""Train a small MoE-GPT with expert parallelism, and check it against the same model dense.

Each FFN is a MoE layer (DeepSeek-V3 group-limited routing, one shared expert, aux-loss-free
bias updates); its routed experts are split over the ranks, and every rank trains on its
own batch of the standard library's docstrings. ``sync_gradients`` turns each rank's
gradients into those of the mean loss over all ranks, so training equals one process
running the dense model (every expert) on all the ranks' batches at once:

    python examples/train_moe.py --ranks 2 --steps 30
"""

from __future__ import annotations

import argparse

import torch
from torch import nn
from train_gpt import corpus

from nobubble.distributed import spawn
from nobubble.moe import (
    Buffer,
    DenseMoE,
    MoEConfig,
    MoELayer,
    init_moe_weights,
    sync_gradients,
)

SEQ, HIDDEN, HEADS, LAYERS, BATCH = 32, 32, 4, 2, 8
CONFIG = MoEConfig(hidden=HIDDEN, expert_hidden=32, num_experts=8, topk=2, num_shared_experts=1,
                   router="deepseek_v3", n_groups=2, topk_groups=1)  # fmt: skip


class Block(nn.Module):
    """Pre-norm causal attention, then a MoE FFN: (B, T, H) -> (B, T, H)."""

    def __init__(self, moe: nn.Module) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(HIDDEN), nn.LayerNorm(HIDDEN)
        self.attn = nn.MultiheadAttention(HIDDEN, HEADS, batch_first=True)
        self.moe = moe

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mask = nn.Transformer.generate_square_subsequent_mask(x.shape[1], device=x.device)
        h = self.ln1(x)
        x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + self.moe(self.ln2(x))


class MoEGPT(nn.Module):
    """Token + position embedding, ``LAYERS`` blocks, a linear head; ``buffer`` None: dense."""

    def __init__(self, vocab: int, buffer: Buffer | None) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.tok, self.pos = nn.Embedding(vocab, HIDDEN), nn.Embedding(SEQ, HIDDEN)
        moes = [
            DenseMoE(CONFIG, init_moe_weights(CONFIG, seed=i)) if buffer is None
            else MoELayer(CONFIG, init_moe_weights(CONFIG, seed=i), buffer)
            for i in range(LAYERS)
        ]  # fmt: skip
        self.blocks = nn.ModuleList(Block(m) for m in moes)
        self.head = nn.Sequential(nn.LayerNorm(HIDDEN), nn.Linear(HIDDEN, vocab))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.tok(ids) + self.pos(torch.arange(ids.shape[1], device=ids.device))
        for block in self.blocks:
            x = block(x)
        return self.head(x)

    def update_expert_bias(self) -> None:
        for block in self.blocks:
            block.moe.update_expert_bias()


def batches(world: int, steps: int) -> tuple[int, list[list[tuple[torch.Tensor, torch.Tensor]]]]:
    """The vocabulary size and, per step, one (inputs, targets) batch per rank."""
    text = corpus()
    chars = sorted(set(text))
    data = torch.tensor([chars.index(c) for c in text])
    g = torch.Generator().manual_seed(1)
    out = []
    for _ in range(steps):
        step = []
        for _ in range(world):
            start = torch.randint(0, len(data) - SEQ - 1, (BATCH,), generator=g)
            window = torch.stack([data[s : s + SEQ + 1] for s in start.tolist()])
            step.append((window[:, :-1], window[:, 1:]))
        out.append(step)
    return len(chars), out


def loss_fn(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def rank_main(ctx, steps: int) -> list[float]:
    """Expert-parallel training on this rank's batches; returns its loss per step."""
    vocab, data = batches(ctx.world_size, steps)
    model = MoEGPT(vocab, Buffer(timeout_s=120))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for step in data:
        x, y = step[ctx.rank]
        loss = loss_fn(model(x), y)
        loss.backward()
        sync_gradients(model)  # expert parallelism only: dp_group None, ep_group the world
        opt.step()
        opt.zero_grad()
        model.update_expert_bias()
        losses.append(float(loss.detach()))
    return losses


def dense_losses(world: int, steps: int) -> list[float]:
    """The same training in one process: the dense model on all ranks' batches together."""
    vocab, data = batches(world, steps)
    model = MoEGPT(vocab, None)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    out = []
    for step in data:
        x, y = torch.cat([b[0] for b in step]), torch.cat([b[1] for b in step])
        loss = loss_fn(model(x), y)  # the mean over every rank's rows
        loss.backward()
        opt.step()
        opt.zero_grad()
        model.update_expert_bias()
        out.append(float(loss.detach()))
    return out


def main(argv: list[str] | None = None) -> tuple[list[float], list[float]]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--no-check", action="store_true", help="skip the dense single-process run")
    args = p.parse_args(argv)
    per_rank = spawn(rank_main, args.ranks, args=(args.steps,), timeout_s=1800)
    ep = [sum(r[i] for r in per_rank) / args.ranks for i in range(args.steps)]
    print(f"expert-parallel over {args.ranks} ranks: loss {ep[0]:.4f} -> {ep[-1]:.4f} "
          f"in {args.steps} steps")  # fmt: skip
    dense = [] if args.no_check else dense_losses(args.ranks, args.steps)
    if dense:
        gap = max(abs(a - b) for a, b in zip(ep, dense, strict=True))
        print(f"dense single process: loss {dense[0]:.4f} -> {dense[-1]:.4f}; "
              f"largest difference {gap:.2e}")  # fmt: skip
    return ep, dense


if __name__ == "__main__":
    main()
