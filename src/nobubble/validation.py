"""Checks of configuration values whose errors name the value and the rule it breaks
(``check_fields("TrainConfig", self, ("num_steps",), ">= 1")`` -> ``ValueError:
TrainConfig.num_steps=0 must be >= 1``), and :func:`finite`, the one test of a real value a
user or a file gives (not NaN or infinite, magnitude at most :data:`MAX_REAL`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any, Literal

__all__ = ["MAX_REAL", "Rule", "check_fields", "check_value", "finite"]

MAX_REAL = 1e15
"""The largest magnitude a given real value may have (1e15 ms is 31,000 years, 1e15 bytes a
petabyte): past it, sums and products of such values lose meaning or overflow."""


def finite(value: Any) -> bool:
    """Whether ``value`` is a real number (not a ``bool``; numpy scalars count) that is not
    NaN or infinite and has magnitude at most :data:`MAX_REAL`."""
    if isinstance(value, bool | str):
        return False
    try:
        x = float(value)
    except (TypeError, ValueError, OverflowError):
        return False
    return math.isfinite(x) and abs(x) <= MAX_REAL


Rule = Literal[">= 1", "> 0", ">= 0"]

_RULES: dict[str, Callable[[float], bool]] = {
    ">= 1": lambda v: v >= 1,
    "> 0": lambda v: v > 0,
    ">= 0": lambda v: v >= 0,
}


def check_value(name: str, value: Any, rule: Rule, *, integer: bool = False) -> None:
    """Raise ``ValueError("{name}={value!r} must be {rule}")`` unless ``value`` keeps ``rule``.

    ``integer``: the value must also be an ``int`` (``bool`` is refused), and the message
    says "must be an integer {rule}". NaN, infinity and floats past :data:`MAX_REAL` never
    pass a rule.
    """
    if rule not in _RULES:
        raise ValueError(f"check_value: rule={rule!r}; choose one of {sorted(_RULES)}")
    is_int = isinstance(value, int) and not isinstance(value, bool)
    is_number = is_int or (isinstance(value, float) and finite(value))
    if integer and not is_int:
        raise ValueError(f"{name}={value!r} must be an integer {rule}")
    if not is_number or not _RULES[rule](value):
        kind = "an integer " if integer else ""
        raise ValueError(f"{name}={value!r} must be {kind}{rule}")


def check_fields(
    owner: str, obj: object, names: Iterable[str], rule: Rule, *, integer: bool = False
) -> None:
    """:func:`check_value` on each attribute ``names`` of ``obj``, reported as ``owner.name``."""
    for name in names:
        check_value(f"{owner}.{name}", getattr(obj, name), rule, integer=integer)
