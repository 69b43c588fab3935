"""The built-in models' layers (:mod:`~nobubble.pipeline.runtime.models` builds them block
by block): a pre-LN GPT's embedding, transformer block and LM head, and a residual MLP block.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["Embedding", "LMHead", "ResidualMLP", "TransformerBlock"]


class Embedding(nn.Module):
    """Token + learned position embedding: (B, T) int64 -> (B, T, H)."""

    def __init__(self, vocab_size: int, seq_len: int, hidden: int) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab_size, hidden)
        self.pos = nn.Embedding(seq_len, hidden)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(idx.shape[1], device=idx.device)
        return self.tok(idx) + self.pos(pos)  # (B, T, H)


class TransformerBlock(nn.Module):
    """Pre-LN block: x + attn(ln1(x)); x + mlp(ln2(x)). (B, T, H) -> (B, T, H)."""

    def __init__(self, hidden: int, num_heads: int) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.ln1 = nn.LayerNorm(hidden)
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.proj = nn.Linear(hidden, hidden)
        self.ln2 = nn.LayerNorm(hidden)
        self.fc = nn.Linear(hidden, 4 * hidden)
        self.fc_out = nn.Linear(4 * hidden, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, h = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(h, dim=2)
        nh = self.num_heads
        q = q.view(b, t, nh, h // nh).transpose(1, 2)  # (B, nh, T, hs)
        k = k.view(b, t, nh, h // nh).transpose(1, 2)  # (B, nh, T, hs)
        v = v.view(b, t, nh, h // nh).transpose(1, 2)  # (B, nh, T, hs)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (B, nh, T, hs)
        y = y.transpose(1, 2).reshape(b, t, h)  # (B, T, H)
        x = x + self.proj(y)
        return x + self.fc_out(F.gelu(self.fc(self.ln2(x))))


class LMHead(nn.Module):
    """Final LayerNorm and vocabulary projection: (B, T, H) -> (B, T, V)."""

    def __init__(self, hidden: int, vocab_size: int) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(hidden)
        self.out = nn.Linear(hidden, vocab_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.ln(x))


class ResidualMLP(nn.Module):
    """x + fc2(gelu(fc1(ln(x)))): (B, H) -> (B, H)."""

    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(hidden)
        self.fc1 = nn.Linear(hidden, 4 * hidden)
        self.fc2 = nn.Linear(4 * hidden, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(F.gelu(self.fc1(self.ln(x))))
