"""Train a small MoE-GPT with expert parallelism, and check it against the same model dense.

Each FFN is a MoE layer (DeepSeek-V3 group-limited routing, one shared expert, aux-loss-free
bias updates); its routed experts are split over the ranks, and every rank trains on its
own batch of the standard library's docstrings. ``sync_gradients`` turns each rank's
gradients into those of the mean loss over all ranks, so training equals one process
running the dense model (every expert; each MoE the token-by-token ``ReferenceMoE``) on
all the ranks' batches at once. The model (embedding, attention blocks with a MoE FFN each,
a head) and the data come from ``nobubble.bench.ep_train``, which ``nobubble ep train``
runs; this script is its training loop without the extras (dp groups, replicas, online EPLB):

    python examples/train_moe.py --ranks 2 --steps 30
"""

from __future__ import annotations

import argparse

import torch

from nobubble.bench.ep_train import MoEGPT, TrainConfig, dense_losses, loss_fn, make_batches
from nobubble.distributed import spawn
from nobubble.moe import Buffer, MoELayer, sync_gradients

# 2 blocks of width 32, 8 routed experts (top-2 in 1 of 2 groups) + 1 shared, 8 x 32 chars
SIZES = dict(hidden=32, expert_hidden=32, num_experts=8, topk=2, num_layers=2, seq_len=32,
             batch_size=8, lr=3e-3)  # fmt: skip


def rank_main(ctx, config: TrainConfig) -> list[float]:
    """Expert-parallel training on this rank's batches; returns its loss per step."""
    vocab, windows = make_batches(config)  # (steps, ranks, batch, seq_len + 1) char ids
    with Buffer(timeout_s=120) as buffer:  # dispatch / combine over the world: one EP group
        moe = config.moe_config()
        model = MoEGPT(config, vocab, lambda weights: MoELayer(moe, weights, buffer))
        opt = torch.optim.AdamW(model.parameters(), lr=config.lr)
        losses = []
        for step in range(config.num_steps):
            batch = windows[step, ctx.rank]  # (B, T + 1)
            loss = loss_fn(model(batch[:, :-1]), batch[:, 1:])
            loss.backward()
            sync_gradients(model)  # expert parallelism only: dp_group None, ep_group the world
            opt.step()
            opt.zero_grad()
            for layer in model.moe_layers():
                layer.update_expert_bias()  # aux-loss-free balancing from this step's loads
            losses.append(float(loss.detach()))
    return losses


def main(argv: list[str] | None = None) -> tuple[list[float], list[float]]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--no-check", action="store_true", help="skip the dense single-process run")
    args = p.parse_args(argv)
    config = TrainConfig(num_ranks=args.ranks, num_steps=args.steps, **SIZES)
    per_rank = spawn(rank_main, args.ranks, args=(config,), timeout_s=1800)
    ep = [sum(r[i] for r in per_rank) / args.ranks for i in range(args.steps)]
    print(f"expert-parallel over {args.ranks} ranks: loss {ep[0]:.4f} -> {ep[-1]:.4f} "
          f"in {args.steps} steps")  # fmt: skip
    if args.no_check:
        return ep, []
    vocab, windows = make_batches(config)
    dense = dense_losses(config, vocab, windows)  # ReferenceMoE: all ranks' batches, one process
    gap = max(abs(a - b) for a, b in zip(ep, dense, strict=True))
    print(f"dense single process: loss {dense[0]:.4f} -> {dense[-1]:.4f}; "
          f"largest difference {gap:.2e}")  # fmt: skip
    return ep, dense


if __name__ == "__main__":
    main()
