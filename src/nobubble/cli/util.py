"""Shared pieces of the command line: argument types, budgets, errors (tables and JSON are
:mod:`nobubble.bench.output`'s). A user mistake raises :class:`UsageError` (or a config's
``ValueError``); ``main`` turns either into one line on stderr, exit 2.
"""

from __future__ import annotations

import argparse
import functools
import os
from pathlib import Path
from typing import Any, NoReturn

from nobubble.files import check_figure_path, check_output_dir, check_output_file
from nobubble.validation import finite

__all__ = [
    "UsageError",
    "ArgumentParser",
    "input_file",
    "output_file",
    "plot_file",
    "output_dir",
    "positive_int",
    "nonneg_int",
    "seed_int",
    "positive_float",
    "nonneg_float",
    "add_json_flag",
]


class UsageError(Exception):
    """A mistake in what the user asked for; printed as one line, exit status 2."""


class ArgumentParser(argparse.ArgumentParser):
    """argparse with a one-line error: ``nobubble pp simulate: error: ...`` and exit 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def _number(kind: type, text: str, *, minimum: float, strict: bool) -> Any:
    try:
        value = kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a{'n integer' if kind is int else ' number'}"
        ) from None
    if isinstance(value, float) and not finite(value):
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite number")
    if value < minimum or (strict and value == minimum):
        bound = f"> {minimum:g}" if strict else f">= {minimum:g}"
        raise argparse.ArgumentTypeError(f"{text} must be {bound}")
    return value


def input_file(text: str) -> Path:
    """argparse type: a regular file that exists and can be read (not a folder, not
    ``/dev/null``'s kind of device)."""
    path = Path(text)
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{text} is a folder; give a file")
    if not path.exists():
        raise argparse.ArgumentTypeError(f"{text}: no such file")
    if not path.is_file():
        raise argparse.ArgumentTypeError(f"{text} is not a regular file; give a file")
    if not os.access(path, os.R_OK):
        raise argparse.ArgumentTypeError(f"{text}: not readable")
    return path


def output_file(text: str) -> Path:
    """argparse type: a file that can be written (checked before any work starts)."""
    try:
        return check_output_file(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def plot_file(text: str) -> Path:
    """argparse type: a figure file that can be written, its format from a suffix matplotlib
    writes (checked before any work, not after the run)."""
    try:
        return check_figure_path(output_file(text))
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def output_dir(text: str) -> Path:
    """argparse type: a folder that exists or can be created, and is writable."""
    try:
        return check_output_dir(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


# argparse types: an integer > 0 / >= 0, a finite number > 0 / >= 0
positive_int = functools.partial(_number, int, minimum=0, strict=True)
nonneg_int = functools.partial(_number, int, minimum=0, strict=False)
positive_float = functools.partial(_number, float, minimum=0.0, strict=True)
nonneg_float = functools.partial(_number, float, minimum=0.0, strict=False)


def seed_int(text: str) -> int:
    """argparse type: a random seed, an integer >= 0 and < 2**63 (torch.manual_seed takes a
    64-bit integer and no more)."""
    value = nonneg_int(text)
    if value >= 2**63:
        raise argparse.ArgumentTypeError(f"{text} must be < 2**63 (a 64-bit seed)")
    return value


def add_json_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--json", action="store_true", help="print machine-readable JSON instead of a table"
    )
