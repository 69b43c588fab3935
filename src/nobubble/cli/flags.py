"""Flags declared from tables: a config's flags map one to one onto its fields, a flag left out
keeps the config's default, and the config's ``__post_init__`` is the only check of a value or
a combination (its ValueError is the one-line error, exit 2); other flags are :func:`add_args`
rows."""

from __future__ import annotations

import argparse
import math
import re
from dataclasses import MISSING, fields, is_dataclass, replace
from pathlib import Path
from typing import Any

from nobubble.cli.util import (
    UsageError,
    _number,
    add_json_flag,
    nonneg_float,
    nonneg_int,
    plot_file,
    positive_float,
    positive_int,
)
from nobubble.settings import BOOL, Settings

__all__ = ["Flag", "integer", "real", "add_config_flags", "config_from_flags", "add_run_flags",
           "flags_given", "apply_flags", "add_args", "config_flags"]  # fmt: skip

Flag = tuple[str, str, Any, str]
"""``(flag, config field, argparse type | tuple of choices | bool, help)``."""


def integer(text: str) -> int:
    """argparse type: an integer of any sign; the config checks its range."""
    return _number(int, text, minimum=-math.inf, strict=False)


def real(text: str) -> float:
    """argparse type: a finite number of any sign; the config checks its range."""
    return _number(float, text, minimum=-math.inf, strict=False)


NUMBERS = {
    (">= 1", True): positive_int,
    (">= 0", True): nonneg_int,
    ("> 0", False): positive_float,
    ("(0, 1]", False): positive_float,
    (">= 0", False): nonneg_float,
    ("[0, 1]", False): nonneg_float,
}
"""A numeric field's argparse type by its check and ``integer`` (the config checks it again)."""


def config_flags(config: type[Settings], spec: str, **kinds: Any) -> tuple[Flag, ...]:
    """The flag rows of the field paths in ``spec`` (space-separated; ``--flag=path`` where the
    flag is not the field's name), their help and argparse type read from each field's
    :func:`~nobubble.settings.setting` (a sub-config's: ``trainer.kl_coef``): a switch, the
    choices, ``kinds[name]``, a number by :data:`NUMBERS`, or ``str``."""
    rows = []
    for item in spec.split():
        flag, _, path = item.rpartition("=")
        *heads, name = path.split(".")
        owner = config
        for head in heads:
            owner = owner.rules()[head]["check"]  # the sub-config's class
        rule = owner.rules()[name]
        check = rule["check"]
        kind = kinds.get(name) or NUMBERS.get((check, rule["integer"]), str)
        if isinstance(check, tuple):
            kind = bool if check == BOOL else check
        rows.append((flag or "--" + name.replace("_", "-"), path, kind, rule["help"]))
    return tuple(rows)


def add_config_flags(parser: Any, config: type, flags: tuple[Flag, ...]) -> None:
    """Declare ``flags`` on ``parser`` (or a group), each storing into its ``config`` field
    (or a sub-config's path, ``"trainer.delay_s"``), the help naming the field's default unless
    it says one; the kind ``list`` makes a flag repeatable (:func:`flags_given`: a tuple)."""
    for flag, path, kind, text in flags:
        if kind is not bool and "default" not in text:
            text += f" (default {_field_default(config, path)})"
        named = kind is bool or isinstance(kind, tuple)  # argparse names a switch's, a choice's
        metavar = {} if named else {"metavar": flag.lstrip("-").upper().replace("-", "_")}
        add_args(parser, ((flag, kind, None, text, {"dest": path, **metavar}),))


def config_from_flags(config: type, flags: tuple[Flag, ...], args: argparse.Namespace,
                      **extra: Any) -> Any:  # fmt: skip
    """``config(**the given flags, **extra)``: a ValueError naming a bad value or combination,
    a UsageError for a flag given that is not one of ``config``'s fields (another config's)."""
    names = {f.name for f in fields(config)}
    given = flags_given(flags, args)
    if odd := [flag for flag, f, _, _ in flags if f in given and f not in names]:
        raise UsageError(f"{', '.join(odd)}: not a setting of {config.__name__}; drop it")
    return config(**given, **extra)


def add_args(parser: Any, rows: tuple[tuple, ...]) -> None:
    """Declare plain flags from rows ``(names, kind, default, help[, extra keywords])``: names
    space-separated (``"-o --output"``), kind an argparse type, a tuple of choices, ``list``
    (a repeatable flag) or bool (a switch)."""
    for names, kind, default, text, *extra in rows:
        how: dict[str, Any] = (
            {"action": "store_true"} if kind is bool
            else {"action": "append"} if kind is list
            else {"choices": kind} if isinstance(kind, tuple)
            else {"type": kind}
        )  # fmt: skip
        parser.add_argument(*names.split(), default=default, help=text, **how,
                            **(extra[0] if extra else {}))  # fmt: skip


def add_run_flags(parser: argparse.ArgumentParser, *, plot: str, force: str,
                  plot_default: Path | None = None) -> None:  # fmt: skip
    """``--plot``, ``--force`` and ``--json``, which every ``ep`` command takes
    (``plot_default``: a figure drawn unless the user names another file)."""
    add_args(parser, (("--plot", plot_file, plot_default, plot), ("--force", bool, False, force)))
    add_json_flag(parser)


def flags_given(flags: tuple[Flag, ...], args: argparse.Namespace) -> dict[str, Any]:
    """``{field path: value}`` of the flags on the command line (None = left out)."""
    values = {path: getattr(args, path, None) for _, path, _, _ in flags}
    return {p: tuple(v) if isinstance(v, list) else v for p, v in values.items() if v is not None}


def apply_flags(config: Any, given: dict[str, Any], flags: tuple[Flag, ...] = ()) -> Any:
    """``config`` (a config class, a function that builds one, or a config to lay the values
    over) with ``given``'s values (:func:`flags_given`), a path's in its sub-config (which
    needs a class or instance); the config's ValueError is re-raised naming the flag."""
    try:
        return _apply(config, given)
    except ValueError as err:
        text = str(err)
        for flag, path, _, _ in flags:
            name = re.escape(path.rpartition(".")[2])
            if path in given and flag not in text and re.search(rf"(?<![\w-]){name}=", text):
                raise ValueError(f"{flag} {given[path]}: {text}") from None
        raise


def _apply(config: Any, given: dict[str, Any]) -> Any:
    top = {k: v for k, v in given.items() if "." not in k}
    nested: dict[str, dict[str, Any]] = {}
    for path, value in given.items():
        if "." in path:
            head, rest = path.split(".", 1)
            nested.setdefault(head, {})[rest] = value
    built = is_dataclass(config) and not isinstance(config, type)
    if nested and not is_dataclass(config):
        raise TypeError(f"{sorted(nested)}: sub-config paths need a config class or instance, "
                        f"not {config!r}")  # fmt: skip
    for head, values in nested.items():
        sub = getattr(config, head) if built else _field_default(config, head)
        top[head] = _apply(sub, values)
    return replace(config, **top) if built else config(**top)


def _field_default(config: type, path: str) -> Any:
    """The default of the field at ``path`` of ``config`` (through sub-configs' defaults)."""
    head, _, rest = path.partition(".")
    (f,) = [f for f in fields(config) if f.name == head]
    value = f.default_factory() if f.default_factory is not MISSING else f.default
    return _field_default(type(value), rest) if rest else value
