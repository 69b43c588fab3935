"""The built-in policy: a small character-level causal transformer whose forward returns
``(logits, values)`` (a policy head and a value head). Shapes: ``B`` sequences, ``T`` tokens,
``V`` vocabulary, ``D`` width, ``nh`` heads, ``hs = D / nh``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from nobubble.rl.system.policies.sampling import position_ids as _positions
from nobubble.validation import check_fields

__all__ = ["PolicyConfig", "CharTransformer"]


@dataclass(frozen=True, kw_only=True)
class PolicyConfig:
    """Shape of the policy network.

    Attributes:
        vocab_size: number of token ids (from the task's tokenizer).
        max_seq_len: longest prompt + response the model will see.
        hidden: residual width.
        num_layers: transformer blocks.
        num_heads: attention heads; must divide ``hidden``.
    """

    vocab_size: int
    max_seq_len: int
    hidden: int = 64
    num_layers: int = 2
    num_heads: int = 4

    def __post_init__(self) -> None:
        names = ("vocab_size", "max_seq_len", "hidden", "num_layers", "num_heads")
        check_fields("PolicyConfig", self, names, ">= 1", integer=True)
        if self.hidden % self.num_heads:
            raise ValueError(
                f"PolicyConfig: hidden={self.hidden} is not divisible by num_heads={self.num_heads}; "
                "pick num_heads that divides hidden"
            )


class _Block(nn.Module):
    def __init__(self, cfg: PolicyConfig) -> None:
        super().__init__()
        self.num_heads = cfg.num_heads
        self.ln1 = nn.LayerNorm(cfg.hidden)
        self.qkv = nn.Linear(cfg.hidden, 3 * cfg.hidden)
        self.proj = nn.Linear(cfg.hidden, cfg.hidden)
        self.ln2 = nn.LayerNorm(cfg.hidden)
        self.mlp = nn.Sequential(
            nn.Linear(cfg.hidden, 4 * cfg.hidden),
            nn.GELU(),
            nn.Linear(4 * cfg.hidden, cfg.hidden),
        )

    def forward(
        self, x: torch.Tensor, attn_mask: torch.Tensor | None = None, *, last_only: bool = False
    ) -> torch.Tensor:
        """``x`` (B, T, D) -> (B, T, D); ``last_only``: the last position's output alone,
        (B, 1, D), from its one query over every key (the causal mask hides none from it)."""
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        if last_only:
            q, x = q[:, -1:], x[:, -1:]
            attn_mask = None if attn_mask is None else attn_mask[:, :, -1:]
        tq, hs = q.shape[1], d // self.num_heads
        q = q.reshape(b, tq, self.num_heads, hs).transpose(1, 2)  # (B, nh, Tq, hs)
        k = k.view(b, t, self.num_heads, hs).transpose(1, 2)  # (B, nh, T, hs)
        v = v.view(b, t, self.num_heads, hs).transpose(1, 2)  # (B, nh, T, hs)
        if attn_mask is None:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=not last_only)
        else:
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask)
        y = y.transpose(1, 2).reshape(b, tq, d)  # (B, Tq, D)
        x = x + self.proj(y)
        return x + self.mlp(self.ln2(x))


class CharTransformer(nn.Module):
    """Causal transformer with a policy head and a value head.

    ``forward(tokens, attention_mask=None, position_ids=None)`` takes ``tokens`` (B, T)
    int64 and returns ``logits`` (B, T, V) float32, where ``logits[:, t]`` scores token
    ``t + 1``, and ``values`` (B, T) float32, the value of the state after token ``t``.
    ``attention_mask`` (B, T), 0 on left padding, hides the padding from every query;
    ``position_ids`` (B, T) default to :func:`position_ids` of the mask. ``last_only=True``
    gives the last position alone, ``logits`` (B, V) and ``values`` (B,): the numbers of
    ``[:, -1]`` of the full forward, with the last block run for that one query.
    """

    returns_values = True  # forward already gives (logits, values): no wrapper needed

    def __init__(self, cfg: PolicyConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.hidden)
        self.pos_emb = nn.Embedding(cfg.max_seq_len, cfg.hidden)
        self.blocks = nn.ModuleList(_Block(cfg) for _ in range(cfg.num_layers))
        self.ln_f = nn.LayerNorm(cfg.hidden)
        self.lm_head = nn.Linear(cfg.hidden, cfg.vocab_size)
        self.value_head = nn.Linear(cfg.hidden, 1)
        self.apply(self._init)
        for name, p in self.named_parameters():
            if name.endswith("proj.weight") or name.endswith("mlp.2.weight"):
                # GPT-2: scale residual projections by depth so the residual stream stays O(1)
                nn.init.normal_(p, std=0.02 / math.sqrt(2 * cfg.num_layers))

    @staticmethod
    def _init(m: nn.Module) -> None:
        if isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, std=0.02)
            nn.init.zeros_(m.bias)
        elif isinstance(m, nn.Embedding):
            nn.init.normal_(m.weight, std=0.02)

    def forward(
        self,
        tokens: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        *,
        last_only: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        b, t = tokens.shape
        if t > self.cfg.max_seq_len:
            raise ValueError(
                f"sequence length {t} exceeds max_seq_len={self.cfg.max_seq_len}; "
                "raise PolicyConfig.max_seq_len"
            )
        attn = None
        if attention_mask is not None and not bool(attention_mask.all()):
            keys = attention_mask.bool()[:, None, None, :]  # (B, 1, 1, T)
            eye = torch.eye(t, dtype=torch.bool, device=tokens.device)
            causal = torch.ones(t, t, dtype=torch.bool, device=tokens.device).tril()
            attn = causal & (keys | eye)  # (B, 1, T, T); a pad query sees itself only
            if position_ids is None:
                position_ids = _positions(attention_mask)
        if position_ids is None:
            position_ids = torch.arange(t, device=tokens.device)[None, :]
        x = self.tok_emb(tokens) + self.pos_emb(position_ids)  # (B, T, D)
        for i, block in enumerate(self.blocks):
            x = block(x, attn, last_only=last_only and i == len(self.blocks) - 1)
        x = self.ln_f(x[:, -1] if last_only else x)  # (B, D) or (B, T, D)
        return self.lm_head(x), self.value_head(x).squeeze(-1)
