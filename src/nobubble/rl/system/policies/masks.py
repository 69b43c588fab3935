"""Masks and positions for left-padded batches.

Prompts of different lengths are *left padded*: ``attention_mask`` is 0 on the padding and
the positions count real tokens only, so a padded prompt gives the same logits as the
prompt alone.
"""

from __future__ import annotations

import torch

__all__ = ["position_ids", "prompt_attention_mask"]


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
