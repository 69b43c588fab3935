"""check_value / check_fields against the rules written out directly."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from nobubble.validation import MAX_REAL, check_fields, check_value, finite

RULES = {">= 1": lambda v: v >= 1, "> 0": lambda v: v > 0, ">= 0": lambda v: v >= 0}
numbers = st.one_of(st.integers(-5, 5), st.floats(allow_nan=True, allow_infinity=True))


@given(value=numbers, rule=st.sampled_from(sorted(RULES)))
def test_a_value_passes_exactly_when_finite_and_inside_the_rule(value, rule) -> None:
    sized = isinstance(value, int) or abs(value) <= 1e15  # 1e308 overflows the next product
    ok = math.isfinite(value) and sized and RULES[rule](value)
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


@given(value=st.floats(allow_nan=True, allow_infinity=True))
def test_finite_is_ieee_finite_and_at_most_1e15_in_size(value) -> None:
    assert finite(value) == (value == value and -1e15 <= value <= 1e15)  # NaN != NaN


def test_finite_takes_numpy_scalars_and_ints() -> None:
    assert finite(np.float32(2.5)) and finite(np.float64(-3.0)) and finite(10**15)
    assert not finite(np.float32("nan")) and not finite(10**16)


@pytest.mark.parametrize("value", [True, "1", None, [1.0], 1e308, -1e16, float("inf")])
def test_finite_refuses_what_is_not_a_usable_real(value) -> None:
    assert MAX_REAL == 1e15 and not finite(value)


def test_a_huge_flag_is_refused_like_inf_before_any_work(capsys) -> None:
    from nobubble.cli import main

    for text in ("1e308", "inf"):
        with pytest.raises(SystemExit) as e:
            main(["pp", "simulate", "-p", "4", "-m", "8", "--tb", text])
        assert e.value.code == 2
        assert f"{text!r} is not a finite number" in capsys.readouterr().err
