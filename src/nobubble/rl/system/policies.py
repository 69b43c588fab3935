"""Policy models (``forward(input_ids, attention_mask=None, position_ids=None) -> (logits,
values)``) and sampling from them. Prompts are *left padded*: ``attention_mask`` is 0 on the
padding and positions count real tokens only, so a padded prompt gives its logits alone.

Legend for shapes: ``B`` sequences, ``P`` prompt length, ``N`` response length (max new
tokens), ``T = P + N`` (any sequence length in the models), ``V`` vocabulary, ``D`` width,
``nh`` heads, ``hs = D / nh``.
"""

from __future__ import annotations

import functools
import inspect
import math
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import nn

from nobubble.imports import check_kwargs, import_extra, is_import_path, load_user_object
from nobubble.validation import check_fields

__all__ = [
    "prompt_attention_mask",
    "Generation",
    "sample",
    "response_logits",
    "PolicyConfig",
    "CharTransformer",
    "CausalLMPolicy",
    "as_policy",
    "build_policy",
    "check_policy_spec",
]


def _positions(attention_mask: torch.Tensor) -> torch.Tensor:
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
    """Sampled responses for a batch of prompts."""

    tokens: torch.Tensor  # (B, P + N) int64, prompt then response, padded after EOS
    response_mask: torch.Tensor  # (B, N) bool, True for generated tokens up to EOS included
    logprobs: torch.Tensor  # (B, N) float32 under the sampling policy, 0 off the mask


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
    """Sample up to ``max_new_tokens`` tokens after each prompt (B, P) int64, incrementally
    with a KV cache when the model ``supports_cache``, else recomputing the prefix per token.

    ``attention_mask`` (B, P) is 0 on left padding (None: no padding). A sequence stops at its
    first EOS or after ``budgets[i]`` tokens ((B,) int64, default ``max_new_tokens``); later
    positions hold ``pad_id`` and are masked out. ``greedy=True`` takes the argmax (log-probs
    stay those of the tempered policy). ``before_token(i)``, called before step ``i`` while a
    sequence is live, returns True after loading new weights (partial rollouts): the KV cache
    is then dropped, so each token's log-prob is that of the weights that sampled it.
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
        positions = _positions(attention_mask)  # (B, P + i)
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
        logits, values = model(tokens[:, :-1], m, _positions(m))
    return logits[:, prompt_len - 1 :], values[:, prompt_len - 1 :]


@dataclass(frozen=True, kw_only=True)
class PolicyConfig:
    """Shape of the policy network; every field an integer >= 1."""

    vocab_size: int  # token ids (from the task's tokenizer)
    max_seq_len: int  # longest prompt + response the model will see
    hidden: int = 64  # residual width
    num_layers: int = 2  # transformer blocks
    num_heads: int = 4  # attention heads; must divide hidden

    def __post_init__(self) -> None:
        names = [f.name for f in fields(self)]
        check_fields("PolicyConfig", self, names, ">= 1", integer=True)
        if self.hidden % self.num_heads:
            raise ValueError(
                f"PolicyConfig: hidden={self.hidden} is not divisible by num_heads={self.num_heads}; "
                "pick num_heads that divides hidden"
            )


class _Block(nn.Module):
    def __init__(self, cfg: PolicyConfig) -> None:
        super().__init__()
        self.num_heads, d = cfg.num_heads, cfg.hidden
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

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
    """Causal transformer with a policy head and a value head: ``forward(tokens (B, T) int64,
    attention_mask=None, position_ids=None)`` -> ``logits`` (B, T, V) float32 (``[:, t]``
    scores token ``t + 1``) and ``values`` (B, T) float32 (the state after token ``t``).
    ``attention_mask`` (0 on left padding) hides the padding; ``last_only=True`` gives
    ``[:, -1]`` alone, (B, V) and (B,), with the last block run for that one query.
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
        for name, p in self.named_parameters():  # GPT-2's init, LayerNorms left as built
            if p.dim() > 1:  # the Linear and Embedding weights
                nn.init.normal_(p, std=0.02)
            elif name.endswith("bias"):
                nn.init.zeros_(p)
        for name, p in self.named_parameters():
            if name.endswith("proj.weight") or name.endswith("mlp.2.weight"):
                # GPT-2: scale residual projections by depth so the residual stream stays O(1)
                nn.init.normal_(p, std=0.02 / math.sqrt(2 * cfg.num_layers))

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
        mask = attention_mask
        if position_ids is None:  # no mask: 0..T-1, what an all-ones mask gives
            position_ids = (
                _positions(mask)
                if mask is not None
                else torch.arange(t, device=tokens.device).expand(b, t)
            )
        attn = None  # no padding: the fast causal path
        if mask is not None and not bool(mask.all()):
            keys = mask.bool()[:, None, None, :]  # (B, 1, 1, T)
            eye = torch.eye(t, dtype=torch.bool, device=tokens.device)
            causal = torch.ones(t, t, dtype=torch.bool, device=tokens.device).tril()
            attn = causal & (keys | eye)  # (B, 1, T, T); a pad query sees itself only
        x = self.tok_emb(tokens) + self.pos_emb(position_ids)  # (B, T, D)
        for i, block in enumerate(self.blocks):
            x = block(x, attn, last_only=last_only and i == len(self.blocks) - 1)
        x = self.ln_f(x[:, -1] if last_only else x)  # (B, D) or (B, T, D)
        return self.lm_head(x), self.value_head(x).squeeze(-1)


class CausalLMPolicy(nn.Module):
    """A policy model around a causal LM ``lm`` whose ``forward(input_ids, ...)`` returns
    logits (B, T, V), a tuple starting with them, or an object with ``.logits`` (Hugging
    Face), cut to the task's ``vocab_size`` ids. ``attention_mask``/``position_ids`` are passed
    when its forward names them; a KV cache serves sampling (:meth:`step`) when it takes
    ``cache`` or ``past_key_values`` and ``use_cache``. The value head is a zero-initialised
    linear layer on the logits, so any LM works with PPO and V-trace.
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
        """The LM's logits (B, ..., V) from its output, cut to the tokenizer's first V ids."""
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
    return model if getattr(model, "returns_values", False) else CausalLMPolicy(model, vocab_size)


def _char(vocab_size: int, max_seq_len: int, **kwargs: Any) -> nn.Module:
    check_kwargs(PolicyConfig, kwargs, "policy_kwargs")
    return CharTransformer(PolicyConfig(vocab_size=vocab_size, max_seq_len=max_seq_len, **kwargs))


def _gpt2(vocab_size: int, max_seq_len: int, **kwargs: Any) -> nn.Module:
    """A ``GPT2LMHeadModel`` from a config (no download): 2 layers, width 64, 4 heads, no
    dropout unless ``kwargs`` (config fields) say otherwise."""
    transformers = import_extra("transformers", "transformers", "hf")
    # bos/eos None: GPT-2's own ids (50256) lie outside a task's vocabulary
    cfg: dict[str, Any] = {"n_layer": 2, "n_embd": 64, "n_head": 4}
    cfg |= dict.fromkeys(("bos_token_id", "eos_token_id"))
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
            f"policy={spec!r} is unknown; choose {', '.join(_BUILTINS)}, 'hf:DIR', "
            "'module:factory' or a callable"
        )
    factory = load_user_object("--policy", spec, "policy")
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
