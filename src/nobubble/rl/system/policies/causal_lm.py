"""Any causal LM as a policy model: :class:`CausalLMPolicy`.

A *policy model* is an ``nn.Module`` whose ``forward(input_ids, attention_mask=None,
position_ids=None)`` returns ``(logits, values)``. :class:`CausalLMPolicy` turns any causal
LM - a Hugging Face ``AutoModelForCausalLM``, or a user module whose forward maps
``input_ids`` (and optionally an attention mask) to logits - into one: it adds a value head
that reads the logits, and samples with the LM's KV cache when its forward takes one.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch
from torch import nn

from nobubble.rl.system.policies.masks import position_ids as _positions

__all__ = ["CausalLMPolicy", "as_policy"]


def _logits_of(out: Any) -> torch.Tensor:
    if isinstance(out, torch.Tensor):
        return out
    if hasattr(out, "logits"):
        return out.logits
    if isinstance(out, tuple | list) and out and isinstance(out[0], torch.Tensor):
        return out[0]
    raise TypeError(
        f"a causal LM's forward returned {type(out).__name__}; return logits (B, T, V), "
        "a tuple whose first item is the logits, or an object with .logits"
    )


class CausalLMPolicy(nn.Module):
    """A policy model around any causal LM.

    Args:
        lm: an ``nn.Module`` whose ``forward(input_ids, ...)`` returns logits (B, T, V), a
            tuple starting with them, or an object with ``.logits`` (Hugging Face).
            ``attention_mask`` and ``position_ids`` are passed when its forward names them;
            a KV cache is used for sampling when it takes ``cache`` or ``past_key_values``
            and ``use_cache`` (Hugging Face causal LMs do).
        vocab_size: V, the task tokenizer's ids; an LM with more logits is cut to the
            first V (fewer raise ValueError on the first forward).

    The value head is a linear layer on the logits: it needs nothing from the LM but its
    output, so any LM works with PPO and V-trace. With GRPO and decoupled PPO the values
    go unused.
    """

    returns_values = True

    def __init__(self, lm: nn.Module, vocab_size: int) -> None:
        super().__init__()
        self.lm = lm
        self.vocab_size = vocab_size
        self.value_head = nn.Linear(vocab_size, 1)
        nn.init.zeros_(self.value_head.weight)
        nn.init.zeros_(self.value_head.bias)
        params = inspect.signature(lm.forward).parameters
        self._names = {n for n in ("attention_mask", "position_ids") if n in params}
        cache_arg = next((n for n in ("cache", "past_key_values") if n in params), None)
        self._cache_arg = cache_arg if cache_arg and "use_cache" in params else None

    @property
    def supports_cache(self) -> bool:
        return self._cache_arg is not None

    def _call(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None,
        position_ids: torch.Tensor | None,
    ) -> Any:
        kw: dict[str, Any] = {}
        if attention_mask is not None and "attention_mask" in self._names:
            kw["attention_mask"] = attention_mask
        if position_ids is not None and "position_ids" in self._names:
            kw["position_ids"] = position_ids
        if self._cache_arg is not None:
            kw["use_cache"] = False  # a full forward (training, evaluation) keeps no cache
        return self.lm(input_ids, **kw)

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if attention_mask is not None and position_ids is None:
            position_ids = _positions(attention_mask)
        logits = self._vocab(_logits_of(self._call(input_ids, attention_mask, position_ids)))
        return logits, self.value_head(logits.float()).squeeze(-1)

    def _vocab(self, logits: torch.Tensor) -> torch.Tensor:
        """The first V logits: an LM with a larger vocabulary samples the tokenizer's ids."""
        if logits.shape[-1] < self.vocab_size:
            raise ValueError(
                f"the LM's logits have {logits.shape[-1]} entries, the task's tokenizer "
                f"{self.vocab_size}; build the LM with vocab_size={self.vocab_size}"
            )
        return logits[..., : self.vocab_size]

    def step(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        position_ids: torch.Tensor,
        cache: Any,
    ) -> tuple[torch.Tensor, Any]:
        """Logits (B, V) of the last position and the LM's new KV cache. ``input_ids`` are
        the tokens not yet in ``cache`` (all of them when ``cache`` is None)."""
        kw: dict[str, Any] = {"attention_mask": attention_mask, "position_ids": position_ids}
        assert self._cache_arg is not None  # callers check supports_cache
        if cache is not None:
            kw[self._cache_arg] = cache
        out = self.lm(input_ids, use_cache=True, **kw)
        new_cache = getattr(out, "cache", None) or getattr(out, "past_key_values", None)
        if new_cache is None:
            raise TypeError("the LM was asked for a KV cache (use_cache=True) and returned none")
        return self._vocab(_logits_of(out)[:, -1]), new_cache


def as_policy(model: nn.Module, vocab_size: int) -> nn.Module:
    """``model`` if it already returns ``(logits, values)`` (``returns_values = True``),
    else the model wrapped in :class:`CausalLMPolicy`."""
    if getattr(model, "returns_values", False):
        return model
    return CausalLMPolicy(model, vocab_size)
