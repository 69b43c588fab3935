"""A model built only from torch's own modules, as blocks to group into pipeline stages.

Embedding -> (TransformerEncoderLayer with its MultiheadAttention, a Conv1d mixer) x k ->
LayerNorm + Linear head. Every block is built from one seed, so the reference (one process,
all blocks) and each rank (its stages' blocks) hold the same weights.
"""

from __future__ import annotations

import torch
from torch import nn

VOCAB, HIDDEN, HEADS = 13, 16, 2


class ConvMixer(nn.Module):
    """``x + conv1d(x)`` over the sequence: ``(B, T, H) -> (B, T, H)``."""

    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.conv = nn.Conv1d(hidden, hidden, kernel_size=3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.conv(x.transpose(1, 2)).transpose(1, 2)  # (B, T, H)


def blocks(num_blocks: int) -> list[nn.Module]:
    """``num_blocks`` (>= 2) blocks: embedding, alternating encoder / conv, then the head."""
    torch.manual_seed(0)
    body: list[nn.Module] = []
    for i in range(num_blocks - 2):
        body.append(
            nn.TransformerEncoderLayer(HIDDEN, HEADS, 2 * HIDDEN, dropout=0.0, batch_first=True)
            if i % 2 == 0
            else ConvMixer(HIDDEN)
        )
    head = nn.Sequential(nn.LayerNorm(HIDDEN), nn.Linear(HIDDEN, VOCAB))
    return [nn.Embedding(VOCAB, HIDDEN), *body, head]


def stages(num_stages: int, num_blocks: int = 8) -> list[nn.Module]:
    """The blocks grouped into ``num_stages`` equal stages (nn.Sequential each)."""
    b = blocks(num_blocks)
    per = num_blocks // num_stages
    return [nn.Sequential(*b[i * per : (i + 1) * per]) for i in range(num_stages)]


def loss_fn(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def batch(num_rows: int, seq_len: int, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return (torch.randint(0, VOCAB, (num_rows, seq_len), generator=g),
            torch.randint(0, VOCAB, (num_rows, seq_len), generator=g))  # fmt: skip
