"""reasoning-gym's procedural tasks as nobubble tasks (``--task rg:<name>``).

reasoning-gym generates questions with verifiable answers from a seed, locally: nothing is
downloaded. :class:`ReasoningGymTask` draws a training pool of ``size`` questions (seed
``seed``) and a held-out evaluation set of ``eval_size`` (seed ``seed + 1``) and scores a
response with the dataset's own verifier, ``score_answer(answer, entry)`` (1.0 when right).
Any other keyword is the dataset's config (``min_digits=1`` for ``chain_sum``, ...).
"""

from __future__ import annotations

from typing import Any

from nobubble.rl.system.imports import missing_extra

__all__ = ["ReasoningGymTask", "rg_dataset"]


def rg_dataset(name: str, size: int, seed: int, config: dict[str, Any]) -> Any:
    """reasoning-gym's dataset ``name``: ``size`` questions generated locally from ``seed``
    with the dataset's ``config``; a ValueError names an unknown dataset or a bad config."""
    try:
        import reasoning_gym
        from reasoning_gym.factory import DATASETS
    except ImportError:
        raise missing_extra("reasoning-gym", "rg") from None
    if name not in DATASETS:
        close = [n for n in sorted(DATASETS) if name[:3] in n][:5]
        hint = f"; did you mean {close}?" if close else ""
        raise ValueError(f"reasoning-gym has no task {name!r}{hint}")
    if size < 1:
        raise ValueError(f"size={size} must be >= 1")
    try:
        return reasoning_gym.create_dataset(name, size=size, seed=seed, **config)
    except (TypeError, AssertionError) as err:
        raise ValueError(f"rg:{name}: bad config {config} ({err})") from None


class ReasoningGymTask:
    """The reasoning-gym dataset ``name`` as a task.

    Args:
        name: a reasoning-gym dataset (``chain_sum``, ``basic_arithmetic``, ...).
        size, eval_size: questions in the training pool and in the evaluation set.
        seed: the pool's seed (the evaluation set uses ``seed + 1``).
        max_new_tokens: room for a response; default: the longest answer + 1 (``<eos>``).
        **config: the dataset's config fields.
    """

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
        if size < 1 or eval_size < 1:
            raise ValueError(f"size={size} and eval_size={eval_size} must be >= 1")
        self._train = rg_dataset(name, size, seed, config)
        self._eval = rg_dataset(name, eval_size, seed + 1, config)
        self.name = f"rg:{name}"
        self._entries: dict[str, tuple[Any, Any]] = {}  # question -> (entry, its dataset)
        for ds in (self._eval, self._train):
            for entry in ds:
                self._entries[entry["question"]] = (entry, ds)
        self._pool = [e["question"] for e in self._train]
        self._evals = [e["question"] for e in self._eval]
        answers = [str(e["answer"]) for e, _ in self._entries.values()]
        self.max_new_tokens = max_new_tokens or max(len(a) for a in answers) + 1
        self.tokenizer_alphabet = "".join(
            sorted({c for text in (*self._entries, *answers) for c in text})
        )

    def prompts(self) -> list[str]:
        return list(self._pool)

    def eval_prompts(self) -> list[str]:
        return list(self._evals)

    def answer(self, prompt: str) -> str:
        return str(self._entries[prompt][0]["answer"])

    def reward(self, prompt: str, response: str) -> float:
        entry, ds = self._entries[prompt]
        return float(ds.score_answer(response, entry))

    def is_correct(self, prompt: str, response: str) -> bool:
        return self.reward(prompt, response) >= 1.0
