"""Tasks: answers against a step-by-step reference, enumerated prompt spaces, dense rewards."""

from __future__ import annotations

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from nobubble.rl.system.tasks import CharTokenizer, DigitsTask, SumDigitsTask, resolve_task


def _terms_by_stepping(a: int, b: int, m: int, n: int) -> str:
    """Walk the sequence one addition at a time (no closed form)."""
    prev, cur, out = a, b, []
    for _ in range(n):
        prev, cur = cur, (cur + (cur - prev)) % m
        out.append(str(cur))
    return "".join(out)


@given(
    st.integers(2, 9).flatmap(
        lambda m: st.tuples(st.just(m), st.integers(0, m - 1), st.integers(0, m - 1))
    ),
    st.integers(1, 9),
)
def test_digits_answer_matches_stepping(mab, n):
    m, a, b = mab
    task = DigitsTask(moduli=(m,), num_terms=(n,), differences=None)
    assert task.answer(f"{a},{b}:{m},{n}") == _terms_by_stepping(a, b, m, n)


def test_digits_eval_set_is_the_whole_space():
    task = DigitsTask(moduli=(5, 7), num_terms=(2, 3), differences=(-1, 1))
    prompts = task.eval_prompts()
    assert len(prompts) == len(set(prompts)) == (5 * 2 + 7 * 2) * 2
    full = DigitsTask(moduli=(3,), num_terms=(2,), differences=None).eval_prompts()
    assert sorted(full) == sorted(f"{a},{b}:3,2" for a in range(3) for b in range(3))
    for p in prompts:
        a, b = (int(x) for x in p.split(":")[0].split(","))
        m = int(p.split(":")[1][0])
        assert (b - a) % m in (1, m - 1)
    assert all(len(task.tokenizer.encode(p)) == 1 + len("a,b:m,n") for p in prompts)


@given(st.text(alphabet="0123456789", max_size=5))
@example("4567")  # the answer and more: wrong past its end
@example("45")
def test_prefix_reward(response):
    task = DigitsTask(moduli=(7,), num_terms=(3,))
    prompt = "2,3:7,3"
    answer = task.answer(prompt)  # "456"
    k = 0
    while k < min(len(answer), len(response)) and answer[k] == response[k]:
        k += 1
    if k == 3 and len(response) > 3:
        k = 2
    assert task.reward(prompt, response) == pytest.approx(k / 3)
    assert (task.reward(prompt, response) == 1.0) == (response == answer)


def test_sum_task():
    task = SumDigitsTask(num_digits=2)
    assert len(task.eval_prompts()) == 100
    assert task.answer("97=") == "16"
    assert task.reward("97=", "16") == 1.0
    assert task.reward("97=", "19") == 0.5
    assert task.reward("97=", "") == 0.0


def test_tokenizer_roundtrip_and_errors():
    tok = CharTokenizer("0123456789,:=")
    ids = tok.encode("3,4:7,3")
    assert ids[0] == tok.bos_id
    assert tok.decode_response([*ids[1:], tok.eos_id, 5]) == "3,4:7,3"
    with pytest.raises(ValueError, match="outside the alphabet"):
        tok.encode("3+4")


def test_bad_settings_name_the_value():
    with pytest.raises(ValueError, match="moduli"):
        DigitsTask(moduli=(12,))
    with pytest.raises(ValueError, match="num_terms"):
        DigitsTask(num_terms=(0,))
    with pytest.raises(ValueError, match="task 'x' is unknown"):
        resolve_task("x")
