"""Multi-turn text environments for the actor-learner core: :mod:`.envs` (the protocol, the
token-level gymnasium env, the built-in envs) and :mod:`.run` (the character-transformer
policy, :func:`text_run_config`, the built-in names).

Entry point: ``train(text_run_config(MyTextEnv))`` with :func:`nobubble.rl.train`. Names are
imported on first use.
"""

from __future__ import annotations

import importlib
from typing import Any

_ENVS = ("TextEnv", "TextStep", "TokenEnv", "GuessNumber", "guess_number_odds", "ReasoningGymEnv")
_RUN = ("TextPolicyConfig", "TextActorCritic", "text_run_config", "text_env_config")
_NAMES = {name: "envs" for name in _ENVS} | {name: "run" for name in _RUN}
__all__ = list(_NAMES)


def __getattr__(name: str) -> Any:
    if name in _NAMES:
        return getattr(importlib.import_module(f"{__name__}.{_NAMES[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
