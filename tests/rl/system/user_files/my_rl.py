"""A user's own RL parts, in a file outside the package: a task, a reward, a GRU policy.

Only torch's own modules; nothing here imports nobubble. The tests drive these through
``--task FILE.py:reverse_task``, ``--reward FILE.py:length_bonus=0.1`` and
``--policy FILE.py:make_gru``.
"""

from __future__ import annotations

import itertools

import torch
from torch import nn


class ReverseTask:
    """Write the prompt's letters backwards: ``"ab="`` -> ``"ba"``. Prompts have 1 to 2
    letters, so they differ in length (the batch is left padded)."""

    name = "reverse"
    max_new_tokens = 3
    tokenizer_alphabet = "abc="

    def prompts(self) -> list[str]:
        out = []
        for n in (1, 2):
            out += ["".join(p) + "=" for p in itertools.product("abc", repeat=n)]
        return out

    def eval_prompts(self) -> list[str]:
        return self.prompts()

    def answer(self, prompt: str) -> str:
        return prompt[:-1][::-1]

    def reward(self, prompt: str, response: str) -> float:
        want = self.answer(prompt)
        right = 0
        for w, g in zip(want, response):
            if w != g:
                break
            right += 1
        return right / len(want) - 0.5 * (len(response) > len(want))  # may be negative


reverse_task = ReverseTask()


def length_bonus(prompt: str, response: str) -> float:
    """A second reward source: -1 for an empty response."""
    return -1.0 if not response else 0.0


class GRULM(nn.Module):
    """An embedding, a GRU and a linear head: forward(input_ids) -> logits (B, T, V)."""

    def __init__(self, vocab_size: int, hidden: int) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab_size, hidden)
        self.rnn = nn.GRU(hidden, hidden, batch_first=True)
        self.head = nn.Linear(hidden, vocab_size)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        out, _ = self.rnn(self.emb(input_ids))
        return self.head(out)


def make_gru(vocab_size: int, max_seq_len: int, hidden: int = 32) -> nn.Module:
    return GRULM(vocab_size, hidden)
