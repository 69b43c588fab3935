"""Policy factories: which model a run trains, named by a string or given as a callable.

``RunConfig.policy`` picks the model; :func:`build_policy` builds it in every process that
needs one (the trainer, each generator), from the spec alone:

- ``"char"`` - the built-in :class:`~nobubble.rl.system.policies.CharTransformer`;
  ``policy_kwargs`` are :class:`~nobubble.rl.system.policies.PolicyConfig` fields (``hidden``,
  ``num_layers``, ``num_heads``).
- ``"gpt2"`` - a Hugging Face GPT-2 built from a ``GPT2Config`` (no download);
  ``policy_kwargs`` are config fields (default 2 layers, width 64, 4 heads, no dropout).
- ``"hf:DIR"`` - ``AutoModelForCausalLM.from_pretrained(DIR)`` from a local directory only;
  its vocabulary must cover the task tokenizer's ids.
- ``"module:factory"`` or ``"path/file.py:factory"`` - the user's factory, called as
  ``factory(vocab_size=V, max_seq_len=T, **policy_kwargs)``; it returns an ``nn.Module``.
- a callable - the same factory, passed as an object (it must pickle: a module-level
  function).

Whatever the factory returns is wrapped by :func:`~nobubble.rl.system.policies.as_policy`
unless it already returns ``(logits, values)``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch import nn

from nobubble.rl.system.imports import check_kwargs, import_extra, is_import_path, load_object
from nobubble.rl.system.policies.causal_lm import as_policy
from nobubble.rl.system.policies.char import CharTransformer, PolicyConfig

__all__ = ["BUILTIN_POLICIES", "build_policy", "check_policy_spec"]

BUILTIN_POLICIES = ("char", "gpt2")


def _gpt2(vocab_size: int, max_seq_len: int, **kwargs: Any) -> nn.Module:
    transformers = import_extra("transformers", "transformers", "hf")
    cfg = {
        "n_layer": 2,
        "n_embd": 64,
        "n_head": 4,
        "resid_pdrop": 0.0,
        "embd_pdrop": 0.0,
        "attn_pdrop": 0.0,
        "bos_token_id": None,  # GPT-2's own ids (50256) lie outside a task's vocabulary
        "eos_token_id": None,
        **kwargs,
    }
    try:
        config = transformers.GPT2Config(vocab_size=vocab_size, n_positions=max_seq_len, **cfg)
    except TypeError as err:
        raise ValueError(f"policy 'gpt2': bad policy_kwargs {kwargs} ({err})") from None
    return transformers.GPT2LMHeadModel(config)


def _pretrained(path: str, vocab_size: int, **kwargs: Any) -> nn.Module:
    auto_lm = import_extra("transformers", "transformers", "hf").AutoModelForCausalLM
    try:
        model = auto_lm.from_pretrained(path, local_files_only=True, **kwargs)
    except OSError as err:
        raise ValueError(f"policy 'hf:{path}': no local checkpoint there ({err})") from None
    embeddings: Any = model.get_input_embeddings()
    have = int(embeddings.num_embeddings)
    if have < vocab_size:
        raise ValueError(
            f"policy 'hf:{path}' has {have} token ids, the task's tokenizer {vocab_size}; "
            "give the task a tokenizer of that checkpoint"
        )
    return model


def check_policy_spec(spec: str | Callable[..., nn.Module]) -> None:
    """Raise ValueError for a spec that cannot name a policy (before any worker starts)."""
    if callable(spec) and not isinstance(spec, str):
        return
    if not isinstance(spec, str):
        raise ValueError(f"policy={spec!r} must be a name, 'hf:DIR', an import path or a callable")
    if spec in BUILTIN_POLICIES or spec.startswith("hf:"):
        return
    if not is_import_path(spec):
        raise ValueError(
            f"policy={spec!r} is unknown; choose {', '.join(BUILTIN_POLICIES)}, 'hf:DIR' or "
            "'module:factory'"
        )
    if not callable(load_object(spec, "policy")):
        raise ValueError(f"policy {spec!r} is not callable; name a factory function or class")


def build_policy(
    spec: str | Callable[..., nn.Module],
    *,
    vocab_size: int,
    max_seq_len: int,
    kwargs: dict[str, Any] | None = None,
) -> nn.Module:
    """A policy model (``forward -> (logits, values)``) for a task of ``vocab_size`` ids and
    sequences of up to ``max_seq_len`` tokens."""
    kw = dict(kwargs or {})
    if spec == "char":
        check_kwargs(PolicyConfig, kw, "policy_kwargs")
        model: nn.Module = CharTransformer(
            PolicyConfig(vocab_size=vocab_size, max_seq_len=max_seq_len, **kw)
        )
    elif spec == "gpt2":
        model = _gpt2(vocab_size, max_seq_len, **kw)
    elif isinstance(spec, str) and spec.startswith("hf:"):
        model = _pretrained(spec[3:], vocab_size, **kw)
    else:
        check_policy_spec(spec)
        factory = load_object(spec, "policy") if isinstance(spec, str) else spec
        check_kwargs(factory, {"vocab_size": 0, "max_seq_len": 0, **kw}, "policy_kwargs")
        model = factory(vocab_size=vocab_size, max_seq_len=max_seq_len, **kw)
        if not isinstance(model, nn.Module):
            raise ValueError(f"policy {spec!r} returned {type(model).__name__}, not an nn.Module")
    return as_policy(model, vocab_size)
