"""The training text of :mod:`nobubble.bench.ep_train`: the standard library's docstrings as
characters, cut into every step's windows."""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from nobubble.bench.ep_train import TrainConfig

from nobubble.bench.ep_config import VOCAB_BOUND

__all__ = ["VOCAB_BOUND", "corpus", "make_batches"]


def corpus() -> str:
    """Docstrings of a few standard-library modules and their members (about 100 KB)."""
    import collections
    import functools
    import itertools
    import json
    import pathlib
    import re

    parts = []
    for mod in (collections, functools, itertools, json, pathlib, re):
        parts.append(inspect.getdoc(mod) or "")
        parts += [inspect.getdoc(obj) or "" for _, obj in inspect.getmembers(mod)]
    return "\n".join(p for p in parts if p)


def make_batches(config: TrainConfig) -> tuple[int, torch.Tensor]:
    """The vocabulary size and every step's windows, ``(S, W, B, T + 1)`` int64 char ids."""
    text = corpus()
    chars = sorted(set(text))
    index = {c: i for i, c in enumerate(chars)}
    data = torch.tensor([index[c] for c in text])
    g = torch.Generator().manual_seed(config.seed + 1)
    c = config
    # one draw per step, so a longer run starts with the same batches as a shorter one
    high, shape = len(data) - c.seq_len - 1, (c.num_ranks, c.batch_size)
    start = torch.stack([torch.randint(0, high, shape, generator=g) for _ in range(c.num_steps)])
    offsets = torch.arange(c.seq_len + 1)
    return len(chars), data[start.unsqueeze(-1) + offsets]  # (S, W, B) -> (S, W, B, T + 1)
