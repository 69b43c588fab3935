"""Sampling from a policy model, the log-probs of its responses, and left padding.

A *policy model* is an ``nn.Module`` whose ``forward(input_ids, attention_mask=None,
position_ids=None)`` returns ``(logits, values)``. Prompts of different lengths are *left
padded*: ``attention_mask`` is 0 on the padding and the positions count real tokens only, so
a padded prompt gives the logits of the prompt alone.

Legend for shapes: ``B`` sequences, ``P`` prompt length, ``N`` response length (max new
tokens), ``T = P + N``, ``V`` vocabulary.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

import torch
from torch import nn

__all__ = [
    "position_ids",
    "prompt_attention_mask",
    "Generation",
    "sample",
    "response_logits",
    "response_logprobs",
]


def position_ids(attention_mask: torch.Tensor) -> torch.Tensor:
    """(B, T) int64 positions that count real tokens only: left padding does not shift them."""
    return (attention_mask.long().cumsum(1) - 1).clamp(min=0)


def prompt_attention_mask(tokens: torch.Tensor, prompt_len: int, pad_id: int) -> torch.Tensor:
    """(B, T) int64: 0 on the left padding of each prompt (the leading ``pad_id`` tokens of
    ``tokens[:, :prompt_len]``), 1 elsewhere. Pads after a response stay 1: causal
    attention never lets a response token see them."""
    head = (tokens[:, :prompt_len] != pad_id).long().cumsum(1) > 0  # (B, P)
    tail = torch.ones_like(tokens[:, prompt_len:], dtype=torch.bool)
    return torch.cat([head, tail], dim=1).long()


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
    model: nn.Module,
    prompts: torch.Tensor,
    *,
    max_new_tokens: int,
    eos_id: int,
    pad_id: int,
    temperature: float = 1.0,
    generator: torch.Generator | None = None,
    greedy: bool = False,
    budgets: torch.Tensor | None = None,
    attention_mask: torch.Tensor | None = None,
    before_token: Callable[[int], bool] | None = None,
) -> Generation:
    """Sample up to ``max_new_tokens`` tokens after each prompt (B, P) int64 from a policy
    model; one with ``supports_cache`` (a ``CausalLMPolicy`` whose LM takes a KV cache)
    samples incrementally with its ``step``, any other recomputes the whole prefix per token.

    ``attention_mask`` (B, P) is 0 on left padding (None: no padding). A sequence stops at its
    first EOS or after ``budgets[i]`` tokens (``budgets``: (B,) int64, default
    ``max_new_tokens``); later positions hold ``pad_id`` and are masked out. ``greedy=True``
    takes the argmax (its log-probs are still those of the tempered policy).
    ``before_token(i)`` is called before decoding step ``i`` while any sequence is live; it
    may load new weights into ``model`` (partial rollouts) and then returns True, and the KV
    cache of the old weights is dropped, so each token's log-prob is exactly that of the
    weights that sampled it.
    """
    if temperature <= 0:
        raise ValueError(f"temperature={temperature} must be > 0; use greedy=True for argmax")
    b, p = prompts.shape
    tokens = prompts
    if budgets is None:
        budgets = torch.full((b,), max_new_tokens, dtype=torch.long)
    if attention_mask is None:
        attention_mask = torch.ones(b, p, dtype=torch.long)
    attention_mask = attention_mask.long()
    padded = not bool(attention_mask.all())
    step = cast(Any, model).step if getattr(model, "supports_cache", False) else None
    cache: Any = None
    fresh = tokens  # the tokens the cache has not seen yet
    done = budgets <= 0
    mask = torch.zeros(b, max_new_tokens, dtype=torch.bool)
    logprobs = torch.zeros(b, max_new_tokens)
    for i in range(max_new_tokens):
        if before_token is not None and before_token(i):
            cache, fresh = None, tokens  # keys and values of the old weights: recompute
        positions = position_ids(attention_mask)  # (B, P + i)
        if step is not None:
            last, cache = step(fresh, attention_mask, positions[:, -fresh.shape[1] :], cache)
        else:
            logits, _ = model(tokens, attention_mask if padded else None, positions)
            last = logits[:, -1]
        logp = torch.log_softmax(last.float() / temperature, dim=-1)  # (B, V)
        if greedy:
            nxt = logp.argmax(dim=-1)
        else:
            nxt = torch.multinomial(logp.exp(), 1, generator=generator).squeeze(1)
        live = ~done
        mask[:, i] = live
        logprobs[:, i] = torch.where(live, logp.gather(1, nxt[:, None]).squeeze(1), 0.0)
        nxt = torch.where(live, nxt, torch.full_like(nxt, pad_id))
        tokens = torch.cat([tokens, nxt[:, None]], dim=1)  # (B, P + i + 1)
        fresh = nxt[:, None]
        attention_mask = torch.cat([attention_mask, torch.ones(b, 1, dtype=torch.long)], dim=1)
        done = done | (nxt == eos_id) | (budgets <= i + 1)
        if bool(done.all()):
            pad = torch.full((b, max_new_tokens - i - 1), pad_id, dtype=tokens.dtype)
            tokens = torch.cat([tokens, pad], dim=1)
            break
    return Generation(tokens=tokens, response_mask=mask, logprobs=logprobs)


def response_logits(
    model: nn.Module,
    tokens: torch.Tensor,
    prompt_len: int,
    attention_mask: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Logits (B, N, V) float32 scoring ``tokens[:, P:]`` of ``tokens`` (B, P + N) int64, and
    values (B, N) float32 of the state before each response token; ``attention_mask``
    (B, P + N) is 0 on left padding (None: no padding)."""
    if attention_mask is None or bool(attention_mask.all()):
        logits, values = model(tokens[:, :-1])  # position t predicts token t + 1
    else:
        m = attention_mask[:, :-1]
        logits, values = model(tokens[:, :-1], m, position_ids(m))
    return logits[:, prompt_len - 1 :], values[:, prompt_len - 1 :]


def response_logprobs(
    model: nn.Module,
    tokens: torch.Tensor,
    prompt_len: int,
    temperature: float = 1.0,
    attention_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Log-prob (B, N) float32 of each response token ``tokens[:, P:]`` under ``model``."""
    logits, _ = response_logits(model, tokens, prompt_len, attention_mask)
    logp = torch.log_softmax(logits.float() / temperature, dim=-1)  # (B, N, V)
    return logp.gather(2, tokens[:, prompt_len:, None]).squeeze(2)
