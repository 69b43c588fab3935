"""The text policy: the RL system's character transformer, read at the newest token.

:class:`TextActorCritic` keeps the core's model contract
(:class:`~nobubble.rl.actor_learner.model.PolicyModel`) around
:class:`~nobubble.rl.system.policies.char.CharTransformer`: an observation is a window of
``L`` token ids (right-aligned, float32, see :mod:`.tokens`), the transformer runs over it
and its last position gives the next token's logits - cut to the ``A`` tokens the model may
say - and the value of the conversation so far. No KV cache: every step re-reads the whole
window, which is cheap at these lengths and keeps a step a pure function of its observation
(what central inference and V-trace need).

Only the last position is read, so the transformer runs with ``last_only=True``: its last
block for that one query (every earlier block, and the last block's keys and values, still
see the whole window), the same numbers as ``CharTransformer.forward(...)[:, -1]`` (the
tests compare them) at about a third of the cost for one block, which is what bounds the
learner here.

The left padding is a token of its own, visible to attention, not masked: positions then
count from the right edge, so "the newest token" always sits at position ``L - 1``, and
the batch runs the transformer's fast causal path instead of a per-row mask.

Legend: ``N`` observations, ``L`` window, ``V`` vocabulary, ``A`` actions.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace

import torch
from torch import nn

from nobubble.rl.system.policies.char import CharTransformer, PolicyConfig

__all__ = ["TextPolicyConfig", "TextActorCritic", "TextPolicyFactory"]


@dataclass(frozen=True, kw_only=True)
class TextPolicyConfig:
    """Shape of the character transformer: :class:`PolicyConfig`'s fields that the env does
    not fix (the vocabulary and the window do); checked as a :class:`PolicyConfig` when
    :meth:`for_env` makes one."""

    hidden: int = 16
    num_layers: int = 1
    num_heads: int = 2

    def for_env(self, vocab_size: int, max_len: int) -> PolicyConfig:
        """The transformer for ``vocab_size`` tokens and a window of ``max_len``."""
        return PolicyConfig(vocab_size=vocab_size, max_seq_len=max_len, **asdict(self))


class TextActorCritic(nn.Module):
    """``obs (..., L) -> (logits (..., A), value (...))`` from a :class:`CharTransformer`.

    Args:
        config: the transformer: V, its ``vocab_size``, is the env's vocabulary; L, its
            ``max_seq_len``, the observation window (``obs_dim``).
        num_actions: A; action ``a`` is token ``first_action_id + a``.
        first_action_id: the token of action 0.
    """

    def __init__(self, config: PolicyConfig, num_actions: int, first_action_id: int) -> None:
        super().__init__()
        if first_action_id + num_actions > config.vocab_size:
            raise ValueError(
                f"TextActorCritic: actions {first_action_id}..{first_action_id + num_actions - 1}"
                f" do not fit the vocabulary of {config.vocab_size} tokens"
            )
        self.obs_dim, self.num_actions = config.max_seq_len, num_actions
        self.first_action_id = first_action_id
        self.lm = CharTransformer(config)

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        lead = obs.shape[:-1]
        tokens = obs.reshape(-1, self.obs_dim).long()  # (N, L)
        logits, values = self.lm(tokens, last_only=True)  # (N, V), (N,)
        a0 = self.first_action_id
        logits = logits[:, a0 : a0 + self.num_actions]  # (N, A): the next token, sayable ones
        return logits.reshape(*lead, self.num_actions), values.reshape(lead)

    def policy(self, obs: torch.Tensor) -> torch.Tensor:
        """``obs (N, L) -> logits (N, A)``."""
        return self.forward(obs)[0]


@dataclass(frozen=True)
class TextPolicyFactory:
    """``(obs_dim, num_actions) -> TextActorCritic``: what ``EnvRunConfig.model`` takes
    (``obs_dim`` is the window ``config.max_seq_len``)."""

    config: PolicyConfig
    first_action_id: int

    def __call__(self, obs_dim: int, num_actions: int) -> TextActorCritic:
        return TextActorCritic(
            replace(self.config, max_seq_len=obs_dim), num_actions, self.first_action_id
        )
