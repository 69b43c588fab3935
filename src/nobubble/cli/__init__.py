"""The ``nobubble`` command: the ``pp`` / ``ep`` / ``rl`` / ``trace`` / ``demo`` groups, each
a module with ``register(parser)`` that imports its heavy dependencies inside the handlers."""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from collections.abc import Sequence

from nobubble import __version__
from nobubble.cli import demo, ep, pp, rl, trace
from nobubble.cli.util import ArgumentParser, UsageError

# (command, module, one-line help); order is the order shown by --help.
GROUPS = (
    ("pp", pp, "pipeline parallelism: schedules, simulation, ILP, runtime"),
    ("ep", ep, "MoE expert parallelism: dispatch/combine, load balancing"),
    ("rl", rl, "RL: synchronous and asynchronous training, corrections"),
    ("trace", trace, "merge and summarise per-rank execution traces"),
    ("demo", demo, "a short tour of every capability, artifacts in ./nobubble-out"),
)


def build_parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(
        prog="nobubble",
        description="Remove idle time from large-model training: see where GPUs wait, "
        "pick or compute the schedule that stops the waiting, and run it.",
    )
    parser.add_argument("--version", action="version", version=f"nobubble {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=ArgumentParser)
    for name, module, help_text in GROUPS:
        group = sub.add_parser(name, help=help_text, description=help_text)
        module.register(group)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the exit status (0 ok, 1 failure, 2 bad usage)."""
    parser = build_parser()
    args = parser.parse_args(None if argv is None else list(argv))
    func = getattr(args, "func", None)
    if func is None:
        # a group without a sub-command: show that group's help
        (getattr(args, "group_parser", None) or parser).print_help()
        return 0 if args.command is None else 2
    main_thread = threading.current_thread() is threading.main_thread()
    # SIGTERM runs the finally blocks (stopping ranks, removing shared memory), as Ctrl-C does
    previous = signal.signal(signal.SIGTERM, _raise_terminated) if main_thread else None
    try:
        return int(func(args) or 0)
    except BrokenPipeError:  # `nobubble ... --json | head`: the reader left; not an error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except (Exception, KeyboardInterrupt) as err:
        rc, what = _failure(err)
        if rc <= 2 and os.environ.get("NOBUBBLE_DEBUG"):
            raise
        print(f"{parser.prog} {args.command}: {what}", file=sys.stderr)
        return rc
    finally:
        if main_thread:  # None: a handler not set from Python; the default stands in
            signal.signal(signal.SIGTERM, previous if previous is not None else signal.SIG_DFL)


def _failure(err: BaseException) -> tuple[int, str]:
    """The exit status and one line of an exception: a user's mistake (``UsageError``,
    ``ValueError``) 2, SIGTERM 143, Ctrl-C 130, anything else our failure, 1."""
    if isinstance(err, UsageError | ValueError):
        return 2, f"error: {err}"
    if isinstance(err, Terminated):
        return 128 + signal.SIGTERM, "terminated"
    if isinstance(err, KeyboardInterrupt):
        return 130, "interrupted"
    return 1, f"failed: {type(err).__name__}: {err} (NOBUBBLE_DEBUG=1 shows the traceback)"


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised like Ctrl-C so that every ``finally`` (stopping ranks and workers,
    removing shared memory) runs before the command exits with 143."""


def _raise_terminated(signum: int, frame: object) -> None:
    raise Terminated()
