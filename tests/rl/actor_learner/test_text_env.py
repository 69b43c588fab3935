"""The text env protocol, its token-level adapter, the built-in envs and the text policy."""

from __future__ import annotations

import itertools

import gymnasium  # noqa: F401 - a hard dependency: a broken install fails here
import numpy as np
import pytest
import torch

from nobubble.rl.actor_learner.config import EnvRunConfig
from nobubble.rl.actor_learner.model import build_model, env_label, env_spaces, vector_env
from nobubble.rl.actor_learner.text import (
    GuessNumber,
    TextActorCritic,
    TextPolicyConfig,
    TextStep,
    TokenEnv,
    check_text_env,
    guess_number_odds,
    text_env_config,
    text_run_config,
)
from nobubble.rl.system.policies import PolicyConfig


def _say(env: TokenEnv, text: str) -> tuple[float, bool]:
    """Speak ``text`` as one turn (its characters, then end-of-turn unless the turn fills)."""
    reward, done = 0.0, False
    for ch in text:
        _, reward, done, _, _ = env.step(env.text_env.turn_alphabet.index(ch) + 1)
    if len(text) < env.text_env.max_turn_chars:
        _, reward, done, _, _ = env.step(0)
    return reward, done


def test_guess_number_answers_higher_lower_and_rewards_the_hit() -> None:
    env = GuessNumber(high=7, max_turns=3)
    env.reset(seed=0)
    secret = env.secret
    assert env.step(str(secret % 7 + 1)).reply in ("higher", "lower")  # any other number
    assert env.step("x").reply == "?"
    assert env.step(str(secret)) == TextStep("correct", 1.0, True)
    env.reset(seed=0)
    miss = str(secret % 7 + 1)
    assert [env.step(miss).done for _ in range(3)] == [False, False, True]  # out of turns


def test_binary_search_always_wins_and_blind_guessing_cannot() -> None:
    """The odds the docs quote, checked by playing every secret of 1-7 in 3 turns."""

    def binary_search(env: GuessNumber) -> float:
        low, high = 1, env.high
        for _ in range(env.max_turns):
            guess = (low + high) // 2
            step = env.step(str(guess))
            if step.reward:
                return 1.0
            low, high = (guess + 1, high) if step.reply == "higher" else (low, guess - 1)
        return 0.0

    wins = []
    for seed in range(200):
        env = GuessNumber()
        env.reset(seed)
        wins.append(binary_search(env))
    assert sum(wins) == len(wins)
    odds = guess_number_odds(7, 3)
    assert odds.binary_search == 1.0
    assert odds.blind_best == pytest.approx(3 / 7)
    assert odds.random_guess == pytest.approx(1 - (6 / 7) ** 3)
    best_blind = max(  # every fixed triple of guesses, over every secret
        sum(s in triple for s in range(1, 8)) / 7
        for triple in itertools.permutations(range(1, 8), 3)
    )
    assert best_blind == pytest.approx(odds.blind_best)


def test_token_env_keeps_the_conversation_as_tokens_and_text() -> None:
    env = TokenEnv(GuessNumber(high=7, max_turns=3), max_len=48)
    obs, _ = env.reset(seed=3)
    secret = env.text_env.secret
    tok = env.tokenizer
    assert obs.shape == (48,) and obs.dtype == np.float32
    opening = [tok.bos_id, *tok.encode("guess 1-7")[1:], tok.eos_id]
    assert obs[-len(opening) :].tolist() == opening and not obs[: -len(opening)].any()
    wrong = str(secret % 7 + 1)
    assert _say(env, wrong) == (0.0, False)  # one digit fills the turn: no end-of-turn needed
    assert _say(env, str(secret)) == (1.0, True)
    hint = "higher" if secret > int(wrong) else "lower"
    assert env.transcript == [
        ("env", "guess 1-7"), ("model", wrong), ("env", hint), ("model", str(secret)),
        ("env", "correct"),
    ]  # fmt: skip
    # the turn's digit is its action's token: action a is token 2 + a
    assert env.tokens[len(opening)] == 2 + env.text_env.turn_alphabet.index(wrong) + 1


def test_an_empty_turn_is_a_turn_and_a_long_episode_is_truncated() -> None:
    env = TokenEnv(GuessNumber(high=7, max_turns=100), max_len=8, max_episode_steps=5)
    env.reset(seed=0)
    outcomes = [env.step(0) for _ in range(5)]  # end-of-turn only: empty turns
    assert [o[3] for o in outcomes] == [False] * 4 + [True]  # truncated at the 5th step
    assert env.transcript[1:3] == [("model", ""), ("env", "?")]
    assert outcomes[-1][0].shape == (8,)  # only the newest 8 tokens
    with pytest.raises(ValueError, match=r"action 11 is outside \[0, 11\)"):
        env.step(11)


def test_a_reward_that_is_not_a_number_is_refused_naming_the_env() -> None:
    class Broken(GuessNumber):
        def step(self, turn: str) -> TextStep:
            return TextStep("?", float("nan"), False)

    env = TokenEnv(Broken(), max_len=16)
    env.reset(seed=0)
    with pytest.raises(ValueError, match=r"text env Broken for turn '0' returned nan"):
        env.step(1)


def test_vocabulary_puts_the_turn_characters_first() -> None:
    env = TokenEnv(GuessNumber(high=7), max_len=8)  # says digits, hears "guess 1-7", "higher"...
    itos = env.tokenizer.itos
    assert env.num_actions == 11 and env.tokenizer.eos_id == 2  # action a is token 2 + a
    assert itos[2 + 1] == "0" and itos[2 + 10] == "9"
    assert set(itos[13:]) == set("guess -highercorrectlower?") - set("0123456789")


def test_a_text_env_that_misses_parts_is_refused_naming_them() -> None:
    class Half:
        alphabet = "ab"

        def reset(self, seed: int) -> str:
            return "a"

    with pytest.raises(ValueError, match=r"text env Half has no step, turn_alphabet, max_turn"):
        check_text_env(Half())
    with pytest.raises(ValueError, match=r"text env Half has no step"):
        text_run_config(Half)


def test_a_turn_alphabet_that_repeats_a_char_is_refused_naming_the_env() -> None:
    class Echo(GuessNumber):
        turn_alphabet = "0120"

    with pytest.raises(ValueError, match=r"text env Echo: turn_alphabet='0120' repeats a char"):
        check_text_env(Echo())


def test_last_only_equals_the_full_forward_at_the_last_token() -> None:
    torch.manual_seed(0)
    for layers in (1, 2):
        shape = PolicyConfig(
            vocab_size=20, max_seq_len=12, hidden=16, num_layers=layers, num_heads=2
        )
        policy = TextActorCritic(12, 5, config=shape, first_action_id=2)
        tokens = torch.randint(0, 20, (7, 12))
        logits, values = policy.lm(tokens)  # (7, 12, 20), (7, 12)
        fast_logits, fast_values = policy.lm(tokens, last_only=True)
        torch.testing.assert_close(fast_logits, logits[:, -1])
        torch.testing.assert_close(fast_values, values[:, -1])
        mask = (torch.arange(12) >= torch.arange(7)[:, None]).long()  # row i: i left pads
        logits, values = policy.lm(tokens, mask)
        fast_logits, fast_values = policy.lm(tokens, mask, last_only=True)
        torch.testing.assert_close(fast_logits, logits[:, -1])
        torch.testing.assert_close(fast_values, values[:, -1])
        obs = tokens.float().reshape(7, 1, 12).expand(7, 3, 12)  # (T, B, L): time-major
        out_logits, out_values = policy(obs)
        assert out_logits.shape == (7, 3, 5) and out_values.shape == (7, 3)
        torch.testing.assert_close(
            out_logits[:, 0], policy.lm(tokens)[0][:, -1, 2:7]
        )  # the sayable tokens


def test_text_config_builds_a_policy_that_fits_the_env() -> None:
    config = text_env_config("guess-number", {"high": 9, "max_turns": 4})
    assert env_label(config.env) == "guess-number"
    obs_dim, num_actions = env_spaces(config.env)
    assert (obs_dim, num_actions) == (48, 11)
    model = build_model(config, obs_dim, num_actions)
    assert isinstance(model, TextActorCritic)
    obs, _ = vector_env(config.env, 4).reset(seed=0)
    logits = model.policy(torch.from_numpy(obs))
    assert logits.shape == (4, 11)


def test_a_model_factory_that_disagrees_with_the_env_is_refused() -> None:
    config = EnvRunConfig(
        model=lambda obs_dim, num_actions: TextActorCritic(
            8, 3, config=PolicyConfig(vocab_size=20, max_seq_len=8), first_action_id=2
        )
    )
    with pytest.raises(ValueError, match=r"obs_dim=8, num_actions=3; the env has obs_dim=4"):
        build_model(config, 4, 2)
    with pytest.raises(ValueError, match=r"model=3 is not callable"):
        EnvRunConfig(model=3)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"hidden=10 is not divisible by num_heads=3"):
        text_env_config("guess-number", policy=TextPolicyConfig(hidden=10, num_heads=3))


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"high": 1}, r"high=1 must be an integer >= 2"),
        ({"turns": 3}, r"unexpected keyword argument 'turns'; options: high, max_turns"),
    ],
)
def test_bad_guess_number_options_are_refused(options: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        text_env_config("guess-number", options)
    with pytest.raises(ValueError, match=r"env='chess' is not a text env"):
        text_env_config("chess")
