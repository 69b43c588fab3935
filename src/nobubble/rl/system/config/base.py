"""Config dataclasses whose fields declare their own checks; the settings every RL run has.

A field made by :func:`setting` carries its rule; :class:`Settings` checks every such field
in ``__post_init__`` and raises ``ValueError`` naming ``Owner.field=value`` and the rule. A
subclass that gives a field another default keeps the rule of the class that declared it;
None passes only where the field's default is None. Torch-free.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, is_dataclass
from typing import Any, TypeVar

from nobubble.validation import check_value, finite

__all__ = ["RLConfig", "Settings", "describe_value", "setting"]

T = TypeVar("T")


def setting(default: T, check: str | tuple | type, *, integer: bool = False) -> T:
    """A dataclass field with ``default`` and its check: a rule of
    :func:`~nobubble.validation.check_value` (``">= 1"``, ``"> 0"``, ``">= 0"``; ``integer``:
    an ``int`` too), an interval (``"(0, 1]"``), a tuple of the allowed values, or a config
    class the value must be an instance of."""
    return field(default=default, metadata={"check": check, "integer": integer})


def _check(name: str, value: Any, check: str | tuple | type, integer: bool) -> None:
    """Raise the ValueError naming ``name=value`` and the fix unless ``value`` passes."""
    if isinstance(check, type):
        if not isinstance(value, check):
            kind = check.__name__
            raise ValueError(
                f"{name}={value!r}: give a {kind}(...) (nobubble.rl.system.config), "
                f"e.g. {kind}(delay_s=0.1)"
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
    """A config whose :func:`setting` fields are checked when it is built."""

    def __post_init__(self) -> None:
        owner = type(self).__name__
        # each field's check, from the nearest class that declared one (an override keeps it)
        rules = {
            name: f.metadata
            for c in reversed(type(self).__mro__)
            for name, f in getattr(c, "__dataclass_fields__", {}).items()
            if "check" in f.metadata
        }
        for f in fields(self):
            rule, value = rules.get(f.name), getattr(self, f.name)
            if rule is None or (value is None and f.default is None):
                continue
            if value is None and isinstance(rule["check"], str):
                raise ValueError(
                    f"{owner}.{f.name}=None: this run needs a value ({rule['check']}); leave "
                    f"it out for the default {f.default}"
                )
            _check(f"{owner}.{f.name}", value, rule["check"], rule["integer"])

    def to_dict(self) -> dict[str, Any]:
        """The config as JSON-ready values (objects by their import name)."""
        return {f.name: describe_value(getattr(self, f.name)) for f in fields(self)}


@dataclass(frozen=True, kw_only=True)
class RLConfig(Settings):
    """What both producers of experience read, with the same meaning (a producer may give a
    setting its own default: a task run stops after 400 updates, an environment run after
    300 s)."""

    seed: int = setting(0, ">= 0", integer=True)  # of the policy init, prompts / envs, sampling
    steps: int | None = setting(None, ">= 1", integer=True)  # learner updates (None: no bound)
    time_budget_s: float | None = setting(None, "> 0")  # of training (None: no limit)
    # versions a sample may lag the learner; an older one is dropped (ledger: stale). 0:
    # on-policy; None: the producer's default
    max_staleness: int | None = setting(None, ">= 0", integer=True)
    # torch intra-op threads of each process that runs the policy (tiny models gain nothing
    # from a second one and lose a lot on a loaded machine)
    threads: int = setting(1, ">= 1", integer=True)
    # the longest wait for any worker (stage, actor, queue, lock) before the run fails naming
    # who is silent (time_budget_s ends a run normally)
    stall_timeout_s: float = setting(120.0, "> 0")


def describe_value(value: Any) -> Any:
    """``value`` as a JSON value: numbers and strings as they are, containers and dataclasses
    item by item, an object (a factory, a callable) by its ``module:qualname``."""
    if value is None or isinstance(value, str | int | float | bool):
        return value
    if is_dataclass(value) and not isinstance(value, type):
        value = {f.name: getattr(value, f.name) for f in fields(value)}
    if isinstance(value, dict):
        return {str(k): describe_value(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [describe_value(v) for v in value]
    target = value if hasattr(value, "__qualname__") else type(value)
    return f"{target.__module__}:{target.__qualname__}"
