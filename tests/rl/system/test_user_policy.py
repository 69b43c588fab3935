"""Policies and tasks the user brings: Hugging Face causal LMs, torch-only LMs, left padding,
the KV cache, tasks and rewards by import path, reasoning-gym, and missing extras.

References are independent of the code under test: an unpadded forward of each sequence
alone, a sampler without the cache, the rewards computed by hand.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from nobubble.rl.system.config import RewardConfig
from nobubble.rl.system.policies import (
    CausalLMPolicy,
    CharTransformer,
    PolicyConfig,
    build_policy,
    sample,
)
from nobubble.rl.system.rewards import Rewarder, RewardSource, parse_reward
from nobubble.rl.system.tasks import TaskSpec, resolve_task
from nobubble.rl.system.types import Sample, SampleGroup
from tests.rl.system.trainer_reference import response_logprobs

USER = Path(__file__).parent / "user_files" / "my_rl.py"


def _left_padded(rows: list[list[int]], pad: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(map(len, rows))
    ids = torch.tensor([[pad] * (width - len(r)) + r for r in rows])
    mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows])
    return ids, mask


ROWS = [[1, 5, 6, 7, 8], [1, 9], [1, 4, 4]]


@pytest.mark.parametrize("kind", ["char", "gpt2"])
def test_left_padding_gives_the_logits_of_the_prompt_alone(kind):
    torch.manual_seed(0)
    model = build_policy(kind, vocab_size=12, max_seq_len=16).eval()
    ids, mask = _left_padded(ROWS)
    with torch.no_grad():
        logits, _ = model(ids, mask)
        for i, row in enumerate(ROWS):
            alone, _ = model(torch.tensor([row]))
            torch.testing.assert_close(logits[i, -len(row) :], alone[0], rtol=1e-5, atol=1e-5)


def test_gpt2_cached_sampling_matches_a_sampler_without_the_cache():
    torch.manual_seed(1)
    model = build_policy("gpt2", vocab_size=12, max_seq_len=16).eval()
    assert isinstance(model, CausalLMPolicy) and model.supports_cache
    ids, mask = _left_padded(ROWS)
    kw = dict(max_new_tokens=6, eos_id=2, pad_id=0, attention_mask=mask)
    steps = []
    model.step = lambda *args: steps.append(1) or CausalLMPolicy.step(model, *args)
    cached = sample(model, ids, generator=torch.Generator().manual_seed(0), **kw)
    assert steps  # the KV-cache path ran
    model._cache_arg = None  # the same LM, recomputing the whole prefix per token
    plain = sample(model, ids, generator=torch.Generator().manual_seed(0), **kw)
    assert torch.equal(cached.tokens, plain.tokens)
    torch.testing.assert_close(cached.logprobs, plain.logprobs, rtol=1e-5, atol=1e-5)
    # and the behaviour log-probs equal one fresh forward over the finished sequences
    full_mask = torch.cat([mask, torch.ones_like(cached.tokens[:, ids.shape[1] :])], 1)
    ref = response_logprobs(model, cached.tokens, ids.shape[1], attention_mask=full_mask)
    m = cached.response_mask
    torch.testing.assert_close(cached.logprobs[m], ref[m], rtol=1e-4, atol=1e-5)


def test_a_torch_only_lm_by_import_path_becomes_a_policy():
    model = build_policy(f"{USER}:make_gru", vocab_size=7, max_seq_len=8, kwargs={"hidden": 8})
    assert isinstance(model, CausalLMPolicy)
    logits, values = model(torch.randint(0, 7, (3, 5)))
    assert logits.shape == (3, 5, 7) and values.shape == (3, 5)
    gen = sample(model, torch.ones(4, 2, dtype=torch.long), max_new_tokens=3, eos_id=2, pad_id=0)
    assert gen.tokens.shape == (4, 5)


def test_a_local_checkpoint_with_a_larger_vocabulary(tmp_path):
    from transformers import GPT2Config, GPT2LMHeadModel

    GPT2LMHeadModel(GPT2Config(vocab_size=40, n_layer=1, n_embd=16, n_head=2)).save_pretrained(
        tmp_path
    )
    model = build_policy(f"hf:{tmp_path}", vocab_size=12, max_seq_len=16)
    logits, _ = model(torch.tensor([[1, 3, 4]]))
    assert logits.shape == (1, 3, 12)  # the first 12 ids: the task tokenizer's
    with pytest.raises(ValueError, match="no local checkpoint"):
        build_policy(f"hf:{tmp_path / 'missing'}", vocab_size=12, max_seq_len=16)


def test_missing_transformers_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "transformers", None)
    with pytest.raises(ImportError, match=r"nobubble\[hf\]"):
        build_policy("gpt2", vocab_size=12, max_seq_len=16)


def test_bad_policy_specs_name_the_value():
    with pytest.raises(ValueError, match="'lstm' is unknown"):
        build_policy("lstm", vocab_size=4, max_seq_len=4)
    with pytest.raises(ValueError, match="no attribute 'nope'"):
        build_policy(f"{USER}:nope", vocab_size=4, max_seq_len=4)


def test_task_spec_of_a_user_file_pads_on_the_left():
    spec = resolve_task(f"{USER}:reverse_task")
    assert spec.name == "reverse" and spec.prompt_len == 4  # <bos> + 2 letters + "="
    ids, mask = spec.encode(["a=", "ab="])
    tok = spec.tokenizer
    assert ids.tolist() == [
        [tok.pad_id, tok.bos_id, *tok.encode("a=")[1:]],
        [tok.bos_id, *tok.encode("ab=")[1:]],
    ]
    assert mask.tolist() == [[0, 1, 1, 1], [1, 1, 1, 1]]
    assert spec.is_correct("ab=", "ba") and not spec.is_correct("ab=", "ab")


def test_a_task_factory_takes_kwargs_and_an_object_refuses_them():
    spec = resolve_task("nobubble.rl.system.tasks:DigitsTask", {"moduli": (5,)})
    assert len(spec.eval_prompts) == 5
    with pytest.raises(ValueError, match="task_kwargs"):
        resolve_task(f"{USER}:reverse_task", {"x": 1})


def test_a_task_missing_its_verifier_is_named():
    class NoReward:
        max_new_tokens = 2

        def prompts(self):
            return ["a"]

    with pytest.raises(ValueError, match="lacks reward"):
        TaskSpec(NoReward())


def _group(prompt: str, responses: list[str]) -> SampleGroup:
    z = torch.zeros(1)
    samples = tuple(
        Sample(i, 0, 0, prompt, r, z.long(), z.bool(), z, policy_version=0)
        for i, r in enumerate(responses)
    )
    return SampleGroup(0, 0, samples)


def test_weighted_reward_sources_sum_any_real_values():
    spec = resolve_task(f"{USER}:reverse_task")
    sources = (parse_reward("task=2"), parse_reward(f"{USER}:length_bonus=0.5"))
    scored, _ = Rewarder(spec, sources, RewardConfig()).score_group(
        _group("ab=", ["ba", "", "bab"])
    )
    # by hand: 2 * task reward + 0.5 * (-1 if empty)
    assert [s.reward for s in scored.samples] == [2.0, 2 * 0.0 - 0.5, 2 * (1.0 - 0.5)]
    with pytest.raises(ValueError, match="weight 'x'"):
        parse_reward("task=x")
    with pytest.raises(ValueError, match="not callable"):
        RewardSource("math:pi")


def test_a_reward_that_is_not_finite_fails_the_sample():
    spec = resolve_task("digits")
    scored, _ = Rewarder(
        spec, (RewardSource(lambda p, r: float("nan")),), RewardConfig(max_retries=1)
    ).score_group(_group("2,3:7,3", ["456"]))
    assert (
        scored.samples[0].reward is None and "not a finite number" in scored.samples[0].reward_error
    )


def test_reasoning_gym_task_uses_its_own_verifier():
    spec = resolve_task(
        "rg:chain_sum", {"size": 20, "eval_size": 5, "min_digits": 1, "max_digits": 1}
    )
    assert spec.num_prompts == 20 and len(spec.eval_prompts) == 5
    for prompt in spec.prompts[:5]:
        answer = spec.task.answer(prompt)
        assert spec.reward(prompt, answer) == 1.0 and spec.is_correct(prompt, answer)
        assert spec.reward(prompt, answer + "9") < 1.0
    ids, mask = spec.encode(spec.prompts[:3])
    assert ids.shape == (3, spec.prompt_len)
    with pytest.raises(ValueError, match="no task 'chain_summ'"):
        resolve_task("rg:chain_summ")


def test_char_transformer_without_padding_is_unchanged():
    torch.manual_seed(0)
    model = CharTransformer(PolicyConfig(vocab_size=9, max_seq_len=8, hidden=16))
    x = torch.randint(3, 9, (2, 6))
    a, _ = model(x)
    b, _ = model(x, torch.ones_like(x))
    torch.testing.assert_close(a, b)


def test_missing_reasoning_gym_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "reasoning_gym", None)
    with pytest.raises(ImportError, match=r"nobubble\[rg\]"):
        resolve_task("rg:chain_sum")
