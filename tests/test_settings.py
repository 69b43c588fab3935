"""nobubble.settings.describe_value: a config's values as JSON, checked against values written
out by hand."""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass

from nobubble.settings import describe_value


@dataclass(frozen=True)
class _Shape:
    hidden: int
    heads: int


def _factory(shape: _Shape, first: int) -> None:
    """A model factory of a run's config."""


def test_values_containers_dataclasses_partials_and_objects_are_described() -> None:
    value = {
        "n": 3, "x": 0.5, "name": "a", "off": None, "ids": (1, 2),
        "shape": _Shape(hidden=16, heads=2),
        "model": functools.partial(_factory, _Shape(8, 1), first=2),
        "fn": _factory,
    }  # fmt: skip
    here = f"{__name__}:_factory"
    assert describe_value(value) == {
        "n": 3, "x": 0.5, "name": "a", "off": None, "ids": [1, 2],
        "shape": {"hidden": 16, "heads": 2},
        "model": {"partial": here, "args": [{"hidden": 8, "heads": 1}], "first": 2},
        "fn": here,
    }  # fmt: skip
    json.dumps(describe_value(value))  # JSON-ready
