"""Policies: the built-in character transformer, any causal LM, and sampling from them.

- :mod:`.char` - :class:`CharTransformer`, the built-in policy;
- :mod:`.causal_lm` - :class:`CausalLMPolicy`, any causal LM with a value head and its KV
  cache;
- :mod:`.masks` - left padding: attention masks and positions;
- :mod:`.sampling` - :func:`sample` and the log-probs of responses;
- :mod:`.factory` - :func:`build_policy`: a policy from a name, a path or a factory.
"""

from __future__ import annotations

from nobubble.rl.system.policies.causal_lm import CausalLMPolicy, as_policy
from nobubble.rl.system.policies.char import CharTransformer, PolicyConfig
from nobubble.rl.system.policies.factory import BUILTIN_POLICIES, build_policy, check_policy_spec
from nobubble.rl.system.policies.masks import position_ids, prompt_attention_mask
from nobubble.rl.system.policies.sampling import (
    Generation,
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
