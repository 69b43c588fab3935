"""Multi-turn text environments for the actor-learner core.

Modules, bottom up: :mod:`.protocol` (:class:`TextEnv`, :class:`TextStep`: the model speaks
a turn, the env replies, the episode ends with a reward), :mod:`.tokens` (a text env as a
token-level gymnasium env), :mod:`.policy` (the character transformer as the core's model),
:mod:`.guess_number` (the built-in env), :mod:`.rg` (a reasoning-gym task over several
turns, with hints), :mod:`.run` (:func:`text_run_config`, the built-in names).

Entry point: ``train(text_run_config(MyTextEnv))`` with
:func:`nobubble.rl.train`. Names are imported on first use.
"""

from __future__ import annotations

import importlib
from typing import Any

_NAMES = {
    "TextEnv": "nobubble.rl.actor_learner.text.protocol",
    "TextStep": "nobubble.rl.actor_learner.text.protocol",
    "TokenEnv": "nobubble.rl.actor_learner.text.tokens",
    "TextPolicyConfig": "nobubble.rl.actor_learner.text.policy",
    "TextActorCritic": "nobubble.rl.actor_learner.text.policy",
    "GuessNumber": "nobubble.rl.actor_learner.text.guess_number",
    "guess_number_odds": "nobubble.rl.actor_learner.text.guess_number",
    "ReasoningGymEnv": "nobubble.rl.actor_learner.text.rg",
    "text_run_config": "nobubble.rl.actor_learner.text.run",
    "text_env_config": "nobubble.rl.actor_learner.text.run",
    "policy_success": "nobubble.rl.actor_learner.text.run",
}
__all__ = list(_NAMES)


def __getattr__(name: str) -> Any:
    if name in _NAMES:
        return getattr(importlib.import_module(_NAMES[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
