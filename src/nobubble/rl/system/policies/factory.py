"""Which model a run trains: :func:`build_policy` builds it, in every process that needs one,
from ``RunConfig.policy`` alone (``char``, ``gpt2``, ``hf:DIR``, ``module:factory`` or a
picklable factory: the table in ``docs/rl/own-model.md``), and :class:`CausalLMPolicy` makes
any causal LM a policy model (``forward -> (logits, values)``).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from nobubble.rl.system.imports import check_kwargs, import_extra, is_import_path, load_object
from nobubble.rl.system.policies.char import CharTransformer, PolicyConfig
from nobubble.rl.system.policies.sampling import position_ids as _positions

__all__ = ["BUILTIN_POLICIES", "CausalLMPolicy", "as_policy", "build_policy", "check_policy_spec"]


class CausalLMPolicy(nn.Module):
    """A policy model around any causal LM.

    Args:
        lm: an ``nn.Module`` whose ``forward(input_ids, ...)`` returns logits (B, T, V), a
            tuple starting with them, or an object with ``.logits`` (Hugging Face).
            ``attention_mask`` and ``position_ids`` are passed when its forward names them;
            a KV cache is used for sampling (``supports_cache``, :meth:`step`) when it takes
            ``cache`` or ``past_key_values`` and ``use_cache`` (Hugging Face causal LMs do).
        vocab_size: V, the task tokenizer's ids; an LM with more logits is cut to the
            first V (fewer raise ValueError on the first forward).

    The value head is a zero-initialised linear layer on the logits, so any LM works with
    PPO and V-trace (GRPO and decoupled PPO leave it unused).
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

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if attention_mask is not None and position_ids is None:
            position_ids = _positions(attention_mask)
        given = {"attention_mask": attention_mask, "position_ids": position_ids}
        kw: dict[str, Any] = {n: v for n, v in given.items() if v is not None and n in self._names}
        if self._cache_arg is not None:
            kw["use_cache"] = False  # a full forward (training, evaluation) keeps no cache
        logits = self._logits(self.lm(input_ids, **kw))
        return logits, self.value_head(logits.float()).squeeze(-1)

    def _logits(self, out: Any) -> torch.Tensor:
        """The LM's logits (B, ..., V) from its output, cut to the first V: an LM with a
        larger vocabulary samples the tokenizer's ids."""
        logits = getattr(out, "logits", out[0] if isinstance(out, tuple | list) and out else out)
        if not isinstance(logits, torch.Tensor):
            raise TypeError(
                f"a causal LM's forward returned {type(out).__name__}; return logits (B, T, V), "
                "a tuple whose first item is the logits, or an object with .logits"
            )
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
        return self._logits(out)[:, -1], new_cache


def as_policy(model: nn.Module, vocab_size: int) -> nn.Module:
    """``model`` if it already returns ``(logits, values)`` (``returns_values = True``),
    else the model wrapped in :class:`CausalLMPolicy`."""
    if getattr(model, "returns_values", False):
        return model
    return CausalLMPolicy(model, vocab_size)


def _char(vocab_size: int, max_seq_len: int, **kwargs: Any) -> nn.Module:
    check_kwargs(PolicyConfig, kwargs, "policy_kwargs")
    return CharTransformer(PolicyConfig(vocab_size=vocab_size, max_seq_len=max_seq_len, **kwargs))


def _gpt2(vocab_size: int, max_seq_len: int, **kwargs: Any) -> nn.Module:
    """A ``GPT2LMHeadModel`` from a config (no download): 2 layers, width 64, 4 heads, no
    dropout unless ``kwargs`` (config fields) say otherwise."""
    transformers = import_extra("transformers", "transformers", "hf")
    # bos/eos None: GPT-2's own ids (50256) lie outside a task's vocabulary
    cfg: dict[str, Any] = {
        "n_layer": 2,
        "n_embd": 64,
        "n_head": 4,
        "bos_token_id": None,
        "eos_token_id": None,
    }
    cfg |= dict.fromkeys(("resid_pdrop", "embd_pdrop", "attn_pdrop"), 0.0) | kwargs
    try:
        config = transformers.GPT2Config(vocab_size=vocab_size, n_positions=max_seq_len, **cfg)
    except TypeError as err:
        raise ValueError(f"policy 'gpt2': bad policy_kwargs {kwargs} ({err})") from None
    return transformers.GPT2LMHeadModel(config)


def _pretrained(path: str, vocab_size: int, max_seq_len: int, **kwargs: Any) -> nn.Module:
    """``AutoModelForCausalLM.from_pretrained(path)``, local files only, covering V ids."""
    auto_lm = import_extra("transformers", "transformers", "hf").AutoModelForCausalLM
    try:
        model = auto_lm.from_pretrained(path, local_files_only=True, **kwargs)
    except OSError as err:
        raise ValueError(f"policy 'hf:{path}': no local checkpoint there ({err})") from None
    have = int(model.get_input_embeddings().num_embeddings)
    if have < vocab_size:
        raise ValueError(
            f"policy 'hf:{path}' has {have} token ids, the task's tokenizer {vocab_size}; "
            "give the task a tokenizer of that checkpoint"
        )
    return model


_BUILTINS: dict[str, Callable[..., nn.Module]] = {"char": _char, "gpt2": _gpt2}
BUILTIN_POLICIES = tuple(_BUILTINS)


def check_policy_spec(spec: str | Callable[..., nn.Module]) -> Callable[..., nn.Module]:
    """The factory ``spec`` names; ValueError for a spec that cannot name one (called before
    any worker starts)."""
    if callable(spec) and not isinstance(spec, str):
        return spec
    if isinstance(spec, str) and spec.startswith("hf:"):
        return functools.partial(_pretrained, spec[3:])
    if isinstance(spec, str) and spec in _BUILTINS:
        return _BUILTINS[spec]
    if not isinstance(spec, str) or not is_import_path(spec):
        raise ValueError(
            f"policy={spec!r} is unknown; choose {', '.join(BUILTIN_POLICIES)}, 'hf:DIR', "
            "'module:factory' or a callable"
        )
    factory = load_object(spec, "policy")
    if not callable(factory):
        raise ValueError(f"policy {spec!r} is not callable; name a factory function or class")
    return factory


def build_policy(
    spec: str | Callable[..., nn.Module],
    *,
    vocab_size: int,
    max_seq_len: int,
    kwargs: dict[str, Any] | None = None,
) -> nn.Module:
    """A policy model (``forward -> (logits, values)``) for a task of ``vocab_size`` ids and
    sequences of up to ``max_seq_len`` tokens: the spec's factory called as
    ``factory(vocab_size=V, max_seq_len=T, **kwargs)``, wrapped by :func:`as_policy`."""
    kw = dict(kwargs or {})
    factory = check_policy_spec(spec)
    check_kwargs(factory, {"vocab_size": 0, "max_seq_len": 0, **kw}, "policy_kwargs")
    model = factory(vocab_size=vocab_size, max_seq_len=max_seq_len, **kw)
    if not isinstance(model, nn.Module):
        raise ValueError(f"policy {spec!r} returned {type(model).__name__}, not an nn.Module")
    return as_policy(model, vocab_size)
