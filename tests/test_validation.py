"""check_value / check_fields against the rules written out directly."""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nobubble.validation import check_fields, check_value

RULES = {">= 1": lambda v: v >= 1, "> 0": lambda v: v > 0, ">= 0": lambda v: v >= 0}
numbers = st.one_of(st.integers(-5, 5), st.floats(allow_nan=True, allow_infinity=True))


@given(value=numbers, rule=st.sampled_from(sorted(RULES)))
def test_a_value_passes_exactly_when_finite_and_inside_the_rule(value, rule) -> None:
    ok = math.isfinite(value) and RULES[rule](value)
    if ok:
        check_value("x", value, rule)
    else:
        with pytest.raises(ValueError, match=rf"^x={value!r} must be {rule}$".replace("+", r"\+")):
            check_value("x", value, rule)


@pytest.mark.parametrize("value", [1.0, True, "3", None])
def test_integer_rule_refuses_non_integers(value) -> None:
    with pytest.raises(ValueError, match="must be an integer >= 1"):
        check_value("n", value, ">= 1", integer=True)


def test_check_fields_names_the_owner_and_the_first_bad_field() -> None:
    @dataclass
    class Cfg:
        num_steps: int = 3
        num_ranks: int = 0

    with pytest.raises(ValueError, match=r"^Cfg.num_ranks=0 must be >= 1$"):
        check_fields("Cfg", Cfg(), ("num_steps", "num_ranks"), ">= 1")
    check_fields("Cfg", Cfg(num_ranks=2), ("num_steps", "num_ranks"), ">= 1")


def test_unknown_rule_is_refused() -> None:
    with pytest.raises(ValueError, match="rule='< 3'"):
        check_value("x", 1, "< 3")  # type: ignore[arg-type]
