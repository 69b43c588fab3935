"""Policies: the built-in character transformer (:mod:`.char`), any causal LM and the
factories that build a run's model (:mod:`.factory`), and sampling (:mod:`.sampling`)."""

from __future__ import annotations

from nobubble.rl.system.policies.char import CharTransformer, PolicyConfig
from nobubble.rl.system.policies.factory import (
    BUILTIN_POLICIES,
    CausalLMPolicy,
    as_policy,
    build_policy,
    check_policy_spec,
)
from nobubble.rl.system.policies.sampling import (
    Generation,
    position_ids,
    prompt_attention_mask,
    response_logits,
    response_logprobs,
    sample,
)

__all__ = [
    "PolicyConfig",
    "CharTransformer",
    "CausalLMPolicy",
    "as_policy",
    "position_ids",
    "prompt_attention_mask",
    "Generation",
    "sample",
    "response_logits",
    "response_logprobs",
    "BUILTIN_POLICIES",
    "build_policy",
    "check_policy_spec",
]
