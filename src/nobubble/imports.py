"""Objects named by import path, ``package.module:attr`` or ``path/to/file.py:attr`` (a user's
task, policy, reward or pipeline model), so worker processes and Ray actors rebuild a run's
user parts themselves; and the one-line error of a missing extra. A file is loaded once
per process, under a name derived from its absolute path: loading it twice gives one object.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import inspect
import sys
from pathlib import Path
from typing import Any

__all__ = ["check_kwargs", "import_extra", "is_import_path", "load_user_object"]


def check_kwargs(fn: Any, kwargs: dict[str, Any], what: str) -> None:
    """Refuse keys of ``kwargs`` that ``fn`` (a function or class) does not take, naming
    them and the ones it does (ValueError); a ``**kwargs`` catch-all takes every key."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return  # a builtin without a signature: judged when called
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return
    named = [n for n, p in params.items() if p.kind is not inspect.Parameter.VAR_POSITIONAL]
    unknown = sorted(set(kwargs) - set(named))
    if unknown:
        name = getattr(fn, "__qualname__", repr(fn))
        raise ValueError(f"{what}: {name} takes no {', '.join(map(repr, unknown))}; it takes "
                         f"{', '.join(named) or 'no settings'}")  # fmt: skip


def is_import_path(spec: str) -> bool:
    """True for ``module:attr`` and ``file.py:attr`` (one colon, both sides non-empty)."""
    head, sep, tail = spec.rpartition(":")
    return bool(sep and head and tail) and "/" not in tail and "://" not in spec


def _load_file(path: Path) -> Any:
    name = "nobubble_user_" + "".join(c if c.isalnum() else "_" for c in str(path))
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ValueError(f"{path} cannot be imported as a Python file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module


def load_user_object(flag: str, spec: str, what: str) -> Any:
    """The object ``spec`` names, imported now: ValueError naming ``spec``, worded with
    ``what`` (e.g. ``"task"``) or ``flag`` (e.g. ``"--task"``), and the fix, for a spec that
    is no import path, a missing file, module or attribute, and whatever the import raises
    (a ``SyntaxError``, the module's own error)."""
    if not is_import_path(spec):
        raise ValueError(
            f"{what} {spec!r} is not an import path; write 'package.module:attr' or "
            "'path/to/file.py:attr'"
        )
    head, _, attr = spec.rpartition(":")
    path = Path(head).expanduser().resolve()
    if head.endswith(".py") and not path.is_file():
        raise ValueError(f"{what} {spec!r}: file {head} does not exist")
    try:
        module = _load_file(path) if head.endswith(".py") else importlib.import_module(head)
    except Exception as err:  # the user's module ran and failed: show what it raised
        if isinstance(err, ModuleNotFoundError) and not head.endswith(".py"):
            raise ValueError(
                f"{what} {spec!r}: module {head!r} is not importable ({err}); put it on "
                "PYTHONPATH or give the file path 'path/to/file.py:attr'"
            ) from None
        text = " ".join(str(err).split())
        raise ValueError(
            f"{flag} {spec}: importing it raised {type(err).__name__}: {text}; fix the module"
        ) from None
    try:
        return functools.reduce(getattr, attr.split("."), module)
    except AttributeError:
        raise ValueError(f"{what} {spec!r}: {head} has no attribute {attr!r}") from None


def import_extra(module: str, package: str, extra: str) -> Any:
    """``module`` of an optional ``package``, imported; else the one-line ImportError that
    names the ``extra`` to install."""
    try:
        return importlib.import_module(module)
    except ImportError:
        raise ImportError(f"{package} is not installed; pip install 'nobubble[{extra}]'") from None
