"""reasoning-gym over several turns: the dataset's own verifier scores, the hints point the way."""

from __future__ import annotations

import gymnasium  # noqa: F401 - a hard dependency: a broken install fails here
import pytest
import reasoning_gym  # noqa: F401 - the [rg] extra, installed by make

from nobubble.rl.actor_learner.text import ReasoningGymEnv, TokenEnv, text_env_config
from nobubble.rl.system.tasks import ReasoningGymPool

SUMS = {  # one-digit sums: "Calculate 4 + 9." -> "13"
    "min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1, "operators": ["+"],
    "allow_parentheses": False, "allow_negation": False,
}  # fmt: skip


@pytest.fixture(scope="module")
def questions() -> ReasoningGymPool:
    return ReasoningGymPool("basic_arithmetic", size=40, **SUMS)


def test_a_wrong_answer_gets_a_hint_and_the_right_one_ends_the_episode(
    questions: ReasoningGymPool,
) -> None:
    env = ReasoningGymEnv(questions, max_turns=3)
    seed = next(i for i, e in enumerate(questions.entries) if int(e["answer"]) >= 1)
    question = env.reset(seed=seed)
    assert question == questions.entries[seed]["question"] and question.startswith("Calculate")
    answer = int(env.entry["answer"])
    assert env.step(str(answer + 1)).reply == "lower"
    assert env.step(str(answer - 1)).reply == "higher"
    step = env.step(str(answer))
    assert (step.reply, step.reward, step.done) == ("correct", 1.0, True)


def test_out_of_turns_the_reward_is_the_verifiers_score_of_the_last_answer(
    questions: ReasoningGymPool,
) -> None:
    env = ReasoningGymEnv(questions, max_turns=2)
    env.reset(seed=1)
    wrong = str(int(env.entry["answer"]) + 3)
    first, last = env.step(wrong), env.step(wrong)
    assert (first.reward, first.done) == (0.0, False)
    score = questions.dataset.score_answer(wrong, env.entry)
    assert (last.reward, last.done) == (score, True) and score < 1.0
    assert env.step("").reply == "wrong"  # not a number: no direction to give


def test_the_alphabets_cover_every_question_answer_and_hint(
    questions: ReasoningGymPool,
) -> None:
    env = ReasoningGymEnv(questions)
    assert set(env.turn_alphabet) <= set("0123456789") and env.max_turn_chars == 2
    token_env = TokenEnv(env, max_len=80)
    for seed in range(40):  # every question encodes without an unknown character
        obs, _ = token_env.reset(seed=seed)
        assert obs.any()


def test_unknown_tasks_and_bad_configs_are_refused_naming_them() -> None:
    with pytest.raises(ValueError, match=r"reasoning-gym has no task 'basic_arith'.*did you mean"):
        ReasoningGymPool("basic_arith")
    with pytest.raises(ValueError, match=r"rg:basic_arithmetic: bad config"):
        ReasoningGymPool("basic_arithmetic", min_digits=0)
    with pytest.raises(ValueError, match=r"max_turns=0 must be an integer >= 1"):
        text_env_config("rg:basic_arithmetic", {"max_turns": 0, "size": 5})


@pytest.mark.long
def test_a_reasoning_gym_task_runs_end_to_end_and_its_reward_rises() -> None:
    """One-digit sums over five turns, under seed, for 60k token steps (about 30 s): the
    trained policy's reward is well above the untrained one's (about 0.07: it rarely says
    the sum). Both are sampled over 400 episodes, which is finer than the greedy eval (a
    greedy policy moves in steps of whole strategies)."""
    from statistics import mean

    from nobubble.rl import train
    from nobubble.rl.actor_learner.model import evaluate

    options = {"max_turns": 5, **SUMS}
    config = text_env_config(
        "rg:basic_arithmetic", options, seed=1, target_return=None, max_env_steps=60_000,
        time_budget_s=90.0, epochs=4, minibatches=4, lr=3e-3,
    )  # fmt: skip
    start = mean(evaluate(None, config, 400, seed=12_345, sampled=True))
    result = train(config)
    assert result.env == "rg:basic_arithmetic" and result.ledger.ok
    assert result.env_steps >= 60_000, "the time cap ended the run: the machine is overloaded"
    assert 0.0 <= start <= 0.15
    end = mean(evaluate(result.model, config, 400, seed=12_345, sampled=True))
    assert end >= max(2 * start, start + 0.06), f"reward {start:.2f} -> {end:.2f} (sampled)"
    # the model that comes back is the one the final evaluation saw (same envs, greedy)
    assert evaluate(result.model, config) == list(result.eval_returns)
