"""``nobubble rl train|compare --env ID``: the environment producer's flags and configs.

``--env`` is a gymnasium id (``CartPole-v1``, ``Acrobot-v1``) or a built-in multi-turn text
environment: ``guess-number`` or ``rg:<task>`` (a reasoning-gym task over several turns),
configured by ``--env-option KEY=VALUE`` (``high=9``, ``max_turns=4``, a dataset's config).
:data:`ENV_FLAGS` are the fields of
:class:`~nobubble.rl.actor_learner.config.EnvRunConfig` that only this producer has (the
shared ones are :data:`nobubble.cli.rl.SHARED_FLAGS`); :func:`env_config` builds the run's
config (``rl compare`` expands it: :func:`nobubble.rl.comparison`). The target return
defaults to the gymnasium spec's ``reward_threshold`` (475 for CartPole-v1, -100 for
Acrobot-v1) and to a success rate of 0.8 for text envs.
"""

from __future__ import annotations

import argparse
import functools
import json
from typing import Any

from nobubble.cli.flags import Flag, apply_flags, flags_given, real
from nobubble.cli.util import nonneg_float, positive_int
from nobubble.rl.actor_learner.config import ARCHS, LOSSES  # torch-free, as the flags need

__all__ = ["ENV_FLAGS", "env_config", "parse_env_options"]


def _target_return(text: str) -> float | str:
    """``--target-return``: a finite number, or ``"none"`` (never stop early)."""
    try:
        return "none" if text.lower() == "none" else real(text)
    except argparse.ArgumentTypeError as err:
        raise argparse.ArgumentTypeError(f"{err} or 'none'") from None


ENV_FLAGS: tuple[Flag, ...] = (
    ("--arch", "arch", ARCHS, "where inference runs: impala (in each actor), seed (central), "
     "sample-factory (central, double-buffered envs); rl train only"),
    ("--actors", "actors", positive_int, "actor processes"),
    ("--envs-per-actor", "envs_per_actor", positive_int, "environments each actor steps"),
    ("--env-step-delay-ms", "env_step_delay_ms", nonneg_float,
     "sleep per env step, a stand-in for a slow simulator"),
    ("--loss", "loss", LOSSES, "ppo (APPO) or vtrace (IMPALA)"),
    ("--env-steps", "max_env_steps", positive_int, "stop after N environment steps"),
    ("--target-return", "target_return", _target_return,
     "stop when the greedy eval mean reaches it ('none': never); default: the env's reward "
     "threshold (CartPole-v1 475, Acrobot-v1 -100; text envs: success 0.8)"),
)  # fmt: skip
"""The environment producer's own flags (``--arch`` first: ``rl compare`` runs them all)."""


def parse_env_options(options: list[str]) -> dict[str, Any]:
    """``["high=9", 'operators=["+"]']`` -> ``{"high": 9, "operators": ["+"]}``: a value is
    JSON when it parses as JSON, else a string."""
    out: dict[str, Any] = {}
    for option in options:
        key, sep, value = option.partition("=")
        if not sep or not key.isidentifier():
            raise ValueError(f"--env-option {option!r}: write KEY=VALUE, e.g. max_turns=4")
        try:
            out[key] = json.loads(value)
        except json.JSONDecodeError:
            out[key] = value
    return out


def env_config(args: argparse.Namespace, shared: tuple[Flag, ...]) -> Any:
    """The run's config from the ``shared`` and :data:`ENV_FLAGS` flags
    (ValueError / ImportError on a bad value or a missing extra)."""
    from nobubble.rl.actor_learner.config import EnvRunConfig
    from nobubble.rl.actor_learner.text import is_text_env, text_env_config

    table = shared + ENV_FLAGS
    given = flags_given(table, args)
    if given.get("target_return") == "none":  # never stop early (left out: the env's target)
        given["target_return"] = None
    if is_text_env(args.env):
        options = parse_env_options(args.env_option or [])
        return apply_flags(functools.partial(text_env_config, args.env, options), given, table)
    if args.env_option:
        raise ValueError(f"--env-option is for text envs; {args.env!r} is a gymnasium id")
    if "target_return" not in given:  # looked up only when needed: it builds the env's spec
        given["target_return"] = _reward_threshold(args.env)
    return apply_flags(EnvRunConfig, {"env": args.env, **given}, table)


def _reward_threshold(env_id: str) -> float | None:
    """The gymnasium spec's ``reward_threshold`` (None when it has none)."""
    import gymnasium

    try:
        threshold = gymnasium.spec(env_id).reward_threshold
    except Exception as err:  # gymnasium's unknown-id errors are not ValueErrors
        raise ValueError(f"--env {env_id!r}: {err}") from None
    return None if threshold is None else float(threshold)
