"""The model ``nobubble demo`` plans with ``pp plan --model
nobubble.cli.demo.pipeline_plan:factory``: an embedding, four ``nn.TransformerEncoderLayer``
blocks and a head (width 64), one batch of token ids and the loss."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch
    from torch import nn

VOCAB, WIDTH, HEADS, SEQ, BATCH = 256, 64, 4, 32, 16


def loss_fn(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Next-token cross entropy: logits ``(B, T, VOCAB)``, targets ``(B, T)``."""
    from torch import nn

    return nn.functional.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1))


def factory() -> tuple[list[nn.Module], torch.Tensor, torch.Tensor, object]:
    """``(blocks, inputs, targets, loss_fn)``: six blocks and a batch of ``BATCH x SEQ`` tokens."""
    import torch
    from torch import nn

    layers = [nn.TransformerEncoderLayer(WIDTH, HEADS, 4 * WIDTH, dropout=0.0, batch_first=True)
              for _ in range(4)]  # fmt: skip
    ids = torch.randint(0, VOCAB, (BATCH, SEQ + 1), generator=torch.Generator().manual_seed(1))
    blocks = [nn.Embedding(VOCAB, WIDTH), *layers, nn.Linear(WIDTH, VOCAB)]
    return blocks, ids[:, :-1], ids[:, 1:], loss_fn  # (B, T) inputs, next tokens as targets
