"""Configs checked when built: a dataclass field made by :func:`setting` carries its rule and
its documentation (the help of the command line's flag for it), and :class:`Settings` checks
every such field in ``__post_init__``."""

from __future__ import annotations

import functools
from dataclasses import dataclass, field, fields, is_dataclass
from typing import Any, TypeVar

from nobubble.validation import check_value, finite

__all__ = ["BOOL", "Settings", "describe_value", "setting"]

BOOL = (False, True)
"""The check of a switch: exactly False or True."""

T = TypeVar("T")


def setting(
    default: T, check: str | tuple | type | None, *, integer: bool = False, help: str = ""
) -> T:
    """A dataclass field: ``default`` (a dict is copied per config), its ``check`` (None, a
    :func:`~nobubble.validation.check_value` rule such as ``">= 1"``, ``integer``: an int too;
    an interval ``"(0, 1]"``, a tuple of allowed values or a config class) and ``help``, its
    documentation (the help of its flag)."""
    meta = {"check": check, "integer": integer, "help": help}
    if isinstance(default, dict):
        return field(default_factory=lambda: dict(default), metadata=meta)  # type: ignore[return-value]
    return field(default=default, metadata=meta)


def _check(name: str, value: Any, check: str | tuple | type, integer: bool) -> None:
    """Raise the ValueError naming ``name=value`` and the fix unless ``value`` passes."""
    if isinstance(check, type):
        if not isinstance(value, check):
            kind = check.__name__
            raise ValueError(
                f"{name}={value!r}: give a {kind}(...) ({check.__module__}), not a "
                f"{type(value).__name__}"
            )
    elif isinstance(check, tuple):
        if not any(type(value) is type(c) and value == c for c in check):
            choices = ", ".join(map(str, check))
            raise ValueError(f"{name}={value!r} is unknown; choose one of {choices}")
    elif check[0] in "([":  # an interval, "(0, 1]"
        low, high = (float(x) for x in check[1:-1].split(","))
        above = finite(value) and (value > low if check[0] == "(" else value >= low)
        if not (above and (value < high if check[-1] == ")" else value <= high)):
            raise ValueError(f"{name}={value!r} must be in {check}")
    else:
        check_value(name, value, check, integer=integer)  # type: ignore[arg-type]


@dataclass(frozen=True, kw_only=True)
class Settings:
    """A config whose :func:`setting` fields are checked when it is built: ValueError naming
    ``Owner.field=value`` and the rule (None passes only where the default is None)."""

    def __post_init__(self) -> None:
        owner = type(self).__name__
        rules = self.rules()
        for f in fields(self):
            rule, value = rules.get(f.name), getattr(self, f.name)
            if rule is None or rule["check"] is None or (value is None and f.default is None):
                continue
            if value is None and isinstance(rule["check"], str):
                raise ValueError(
                    f"{owner}.{f.name}=None: this run needs a value ({rule['check']}); leave "
                    f"it out for the default {f.default}"
                )
            _check(f"{owner}.{f.name}", value, rule["check"], rule["integer"])

    @classmethod
    def rules(cls) -> dict[str, Any]:
        """Field name -> its :func:`setting` metadata, from the nearest class that declared
        one (a subclass that only changes the default keeps it)."""
        return {
            name: f.metadata
            for c in reversed(cls.__mro__)
            for name, f in getattr(c, "__dataclass_fields__", {}).items()
            if "check" in f.metadata
        }

    def to_dict(self) -> dict[str, Any]:
        """The config as JSON-ready values (objects by their import name)."""
        return {f.name: describe_value(getattr(self, f.name)) for f in fields(self)}


def describe_value(value: Any) -> Any:
    """``value`` as a JSON value: numbers and strings as they are, containers and dataclasses
    item by item, a ``functools.partial`` as its function and keywords, an object (a factory,
    a callable) by its ``module:qualname``."""
    if value is None or isinstance(value, str | int | float | bool):
        return value
    if isinstance(value, functools.partial):
        value = {"partial": value.func, "args": value.args, **value.keywords}
    if is_dataclass(value) and not isinstance(value, type):
        value = {f.name: getattr(value, f.name) for f in fields(value)}
    if isinstance(value, dict):
        return {str(k): describe_value(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [describe_value(v) for v in value]
    target = value if hasattr(value, "__qualname__") else type(value)
    return f"{target.__module__}:{target.__qualname__}"
