"""A small character-level causal transformer policy, built from scratch (no downloads).

The model reads a prompt and writes a response one character at a time. It has two heads:
the language-model head (next-token logits, the policy) and a scalar value head (a baseline
for V-trace). Sampling returns the tokens with the behaviour log-probabilities of the
sampled tokens, which every sample carries to the trainer for off-policy corrections.

Legend for shapes: ``B`` sequences, ``P`` prompt length, ``N`` response length (max new
tokens), ``T = P + N``, ``V`` vocabulary, ``D`` model width.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from nobubble.validation import check_fields

__all__ = [
    "PolicyConfig",
    "CharTransformer",
    "Generation",
    "sample",
    "response_logits",
    "response_logprobs",
]


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

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        hs = d // self.num_heads
        q = q.view(b, t, self.num_heads, hs).transpose(1, 2)  # (B, nh, T, hs)
        k = k.view(b, t, self.num_heads, hs).transpose(1, 2)  # (B, nh, T, hs)
        v = v.view(b, t, self.num_heads, hs).transpose(1, 2)  # (B, nh, T, hs)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        y = y.transpose(1, 2).reshape(b, t, d)  # (B, T, D)
        x = x + self.proj(y)
        return x + self.mlp(self.ln2(x))


class CharTransformer(nn.Module):
    """Causal transformer with a policy head and a value head.

    ``forward(tokens)`` takes ``tokens`` (B, T) int64 and returns ``(logits, values)``:
    ``logits`` (B, T, V) float32, where ``logits[:, t]`` scores token ``t + 1``, and
    ``values`` (B, T) float32, the value estimate of the state after token ``t``.
    """

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

    def forward(self, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        b, t = tokens.shape
        if t > self.cfg.max_seq_len:
            raise ValueError(
                f"sequence length {t} exceeds max_seq_len={self.cfg.max_seq_len}; "
                "raise PolicyConfig.max_seq_len"
            )
        pos = torch.arange(t, device=tokens.device)
        x = self.tok_emb(tokens) + self.pos_emb(pos)  # (B, T, D)
        for block in self.blocks:
            x = block(x)
        x = self.ln_f(x)
        return self.lm_head(x), self.value_head(x).squeeze(-1)


@dataclass(frozen=True)
class Generation:
    """Sampled responses for a batch of prompts.

    Attributes:
        tokens: (B, P + N) int64, prompt then response; after EOS the response is padded.
        response_mask: (B, N) bool, True for generated tokens up to and including EOS.
        logprobs: (B, N) float32, log-prob of each sampled token under the sampling policy
            (0 where the mask is False).
    """

    tokens: torch.Tensor
    response_mask: torch.Tensor
    logprobs: torch.Tensor


@torch.no_grad()
def sample(
    model: CharTransformer,
    prompts: torch.Tensor,
    *,
    max_new_tokens: int,
    eos_id: int,
    pad_id: int,
    temperature: float = 1.0,
    generator: torch.Generator | None = None,
    greedy: bool = False,
    budgets: torch.Tensor | None = None,
) -> Generation:
    """Sample up to ``max_new_tokens`` tokens after each prompt (B, P) int64.

    A sequence stops at its first EOS or after ``budgets[i]`` tokens (``budgets``: (B,)
    int64, default ``max_new_tokens``, like a request's ``max_tokens``); later positions hold
    ``pad_id`` and are masked out. ``greedy=True`` takes the argmax (its log-probs are still
    those of the tempered policy).
    """
    if temperature <= 0:
        raise ValueError(f"temperature={temperature} must be > 0; use greedy=True for argmax")
    b, p = prompts.shape
    tokens = prompts
    if budgets is None:
        budgets = torch.full((b,), max_new_tokens, dtype=torch.long)
    done = budgets <= 0
    mask = torch.zeros(b, max_new_tokens, dtype=torch.bool)
    logprobs = torch.zeros(b, max_new_tokens)
    for i in range(max_new_tokens):
        logits, _ = model(tokens)
        logp = torch.log_softmax(logits[:, -1].float() / temperature, dim=-1)  # (B, V)
        if greedy:
            nxt = logp.argmax(dim=-1)
        else:
            nxt = torch.multinomial(logp.exp(), 1, generator=generator).squeeze(1)
        live = ~done
        mask[:, i] = live
        logprobs[:, i] = torch.where(live, logp.gather(1, nxt[:, None]).squeeze(1), 0.0)
        nxt = torch.where(live, nxt, torch.full_like(nxt, pad_id))
        tokens = torch.cat([tokens, nxt[:, None]], dim=1)  # (B, P + i + 1)
        done = done | (nxt == eos_id) | (budgets <= i + 1)
        if bool(done.all()):
            pad = torch.full((b, max_new_tokens - i - 1), pad_id, dtype=tokens.dtype)
            tokens = torch.cat([tokens, pad], dim=1)
            break
    return Generation(tokens=tokens, response_mask=mask, logprobs=logprobs)


def response_logits(
    model: CharTransformer, tokens: torch.Tensor, prompt_len: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Logits and values at the positions that predict the response tokens.

    Args:
        tokens: (B, P + N) int64.
        prompt_len: P.
    Returns:
        logits (B, N, V) float32 scoring ``tokens[:, P:]``; values (B, N) float32, the value
        of the state before each response token.
    """
    logits, values = model(tokens[:, :-1])  # position t predicts token t + 1
    return logits[:, prompt_len - 1 :], values[:, prompt_len - 1 :]


def response_logprobs(
    model: CharTransformer, tokens: torch.Tensor, prompt_len: int, temperature: float = 1.0
) -> torch.Tensor:
    """Log-prob (B, N) float32 of each response token ``tokens[:, P:]`` under ``model``."""
    logits, _ = response_logits(model, tokens, prompt_len)
    logp = torch.log_softmax(logits.float() / temperature, dim=-1)  # (B, N, V)
    return logp.gather(2, tokens[:, prompt_len:, None]).squeeze(2)
