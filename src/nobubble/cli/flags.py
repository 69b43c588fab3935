"""Flags declared from a config dataclass: one table per command, ``(flag, field, type, help)``.

A command's flags map one to one onto its library config's fields (:func:`add_config_flags`);
a flag left out keeps the config's own default (not restated here), and
:func:`config_from_flags` builds the config, whose ``__post_init__`` is the only check of a
value or a combination (its ValueError is the one-line error, exit 2). The ``ep`` commands
and ``pp profile | plan | run``'s built-in model declare theirs this way.
"""

from __future__ import annotations

import argparse
from dataclasses import MISSING, fields
from pathlib import Path
from typing import Any

from nobubble.cli.util import UsageError, add_json_flag, plot_file

__all__ = ["Flag", "add_config_flags", "config_from_flags", "add_run_flags"]

Flag = tuple[str, str, Any, str]
"""``(flag, config field, argparse type | tuple of choices | bool, help)``."""


def add_config_flags(
    parser: argparse._ActionsContainer, config: type, flags: tuple[Flag, ...]
) -> None:
    """Declare ``flags`` on ``parser``, each storing into its ``config`` field; the help
    names the config's default unless it already says what the default is."""
    defaults = {f.name: f.default for f in fields(config) if f.default is not MISSING}
    for flag, field, kind, text in flags:
        if kind is not bool and "default" not in text:
            text += f" (default {defaults[field]})"
        how: dict[str, Any] = (
            {"action": "store_true"} if kind is bool
            else {"choices": kind} if isinstance(kind, tuple)
            else {"type": kind, "metavar": flag.lstrip("-").upper().replace("-", "_")}
        )  # fmt: skip
        parser.add_argument(flag, dest=field, default=None, help=text, **how)


def config_from_flags(config: type, flags: tuple[Flag, ...], args: argparse.Namespace,
                      **extra: Any) -> Any:  # fmt: skip
    """``config(**the given flags, **extra)``: a ValueError naming a bad value or combination,
    a UsageError for a flag given that is not one of ``config``'s fields (another config's)."""
    names = {f.name for f in fields(config)}
    given = {f: getattr(args, f) for _, f, _, _ in flags if getattr(args, f) is not None}
    if odd := [flag for flag, f, _, _ in flags if f in given and f not in names]:
        raise UsageError(f"{', '.join(odd)}: not a setting of {config.__name__}; drop it")
    return config(**given, **extra)


def add_run_flags(parser: argparse.ArgumentParser, *, plot: str, force: str,
                  plot_default: Path | None = None) -> None:  # fmt: skip
    """``--plot``, ``--force`` and ``--json``, which every ``ep`` command takes
    (``plot_default``: a figure drawn unless the user names another file)."""
    parser.add_argument("--plot", type=plot_file, default=plot_default, help=plot)
    parser.add_argument("--force", action="store_true", help=force)
    add_json_flag(parser)
