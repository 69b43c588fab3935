"""reasoning-gym's procedural datasets as tasks (``--task rg:<name>``), generated locally
from a seed (nothing is downloaded) and scored by the dataset's own verifier,
``score_answer(answer, entry)`` (1.0 when right). Both producers draw from
:class:`ReasoningGymPool`: :class:`ReasoningGymTask` here, and the environment producer's
:class:`~nobubble.rl.actor_learner.text.ReasoningGymEnv`.
"""

from __future__ import annotations

from typing import Any

from nobubble.rl.system.imports import import_extra
from nobubble.validation import check_value

__all__ = ["ReasoningGymPool", "ReasoningGymTask"]


def _chars(texts: list[str]) -> str:
    return "".join(sorted(set("".join(texts))))


class ReasoningGymPool:
    """``size`` questions of reasoning-gym's dataset ``name``, generated from ``seed`` with
    the dataset's ``config`` (``min_digits=1`` for ``chain_sum``, ...).

    Attributes: ``name`` (``rg:<name>``), ``dataset``, its ``entries`` (question, answer,
    metadata) in order, their ``answers`` as text, and the sorted characters of the answers
    (``answer_chars``) and of the questions and answers (``chars``).

    Raises:
        ValueError: an unknown dataset (with the names close to it), a bad config, a size < 1.
        ImportError: the ``rg`` extra is not installed.
    """

    def __init__(self, name: str, *, size: int = 500, seed: int = 0, **config: Any) -> None:
        reasoning_gym = import_extra("reasoning_gym", "reasoning-gym", "rg")
        datasets = import_extra("reasoning_gym.factory", "reasoning-gym", "rg").DATASETS
        if name not in datasets:
            close = [n for n in sorted(datasets) if name[:3] in n][:5]
            hint = f"; did you mean {close}?" if close else ""
            raise ValueError(f"reasoning-gym has no task {name!r}{hint}")
        check_value("size", size, ">= 1", integer=True)
        try:
            self.dataset = reasoning_gym.create_dataset(name, size=size, seed=seed, **config)
        except (TypeError, AssertionError) as err:
            raise ValueError(f"rg:{name}: bad config {config} ({err})") from None
        self.name = f"rg:{name}"
        self.entries: list[dict[str, Any]] = list(self.dataset)
        self.answers = [str(e["answer"]) for e in self.entries]
        self.answer_chars = _chars(self.answers)
        self.chars = _chars([e["question"] for e in self.entries] + self.answers)

    def score(self, entry: dict[str, Any], response: str) -> float:
        """The dataset's verifier on ``response`` to ``entry`` (1.0 when right)."""
        return float(self.dataset.score_answer(response, entry))


class ReasoningGymTask:
    """The reasoning-gym dataset ``name`` as a task: a training pool of ``size`` questions
    (seed ``seed``) and a held-out evaluation set of ``eval_size`` (seed ``seed + 1``).
    ``max_new_tokens`` defaults to the longest answer + 1 (``<eos>``); ``**config`` is the
    dataset's config."""

    def __init__(
        self,
        name: str,
        *,
        size: int = 500,
        eval_size: int = 100,
        seed: int = 0,
        max_new_tokens: int | None = None,
        **config: Any,
    ) -> None:
        check_value("eval_size", eval_size, ">= 1", integer=True)
        evals = ReasoningGymPool(name, size=eval_size, seed=seed + 1, **config)
        pool = ReasoningGymPool(name, size=size, seed=seed, **config)
        self.name = pool.name
        # question -> (entry, its pool); a question in both is scored as the training pool's
        self._entries = {e["question"]: (e, p) for p in (evals, pool) for e in p.entries}
        self._prompts = [[e["question"] for e in p.entries] for p in (pool, evals)]
        self.max_new_tokens = max_new_tokens or max(map(len, evals.answers + pool.answers)) + 1
        self.tokenizer_alphabet = _chars([evals.chars, pool.chars])

    def prompts(self) -> list[str]:
        return list(self._prompts[0])

    def eval_prompts(self) -> list[str]:
        return list(self._prompts[1])

    def answer(self, prompt: str) -> str:
        return str(self._entries[prompt][0]["answer"])

    def reward(self, prompt: str, response: str) -> float:
        entry, pool = self._entries[prompt]
        return pool.score(entry, response)

    def is_correct(self, prompt: str, response: str) -> bool:
        return self.reward(prompt, response) >= 1.0
